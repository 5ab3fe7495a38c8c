/// Text for HTML: every character that could open markup or end an attribute is escaped. Pages
/// of the server's console and the simulator's phone print user data (content state, attributes,
/// alerts, sentences) only through here.
public enum HTML {
    public static func escape(_ s: String) -> String {
        var out = ""
        out.reserveCapacity(s.utf8.count)
        for c in s.unicodeScalars {
            switch c {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default: out.unicodeScalars.append(c)
            }
        }
        return out
    }
}
