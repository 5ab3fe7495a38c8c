import ArgumentParser
import Crypto
import Foundation
import IsleServer
import IsleStore
import IsleDelivery

/// `isle app ticket-key create|import|list|remove`: the keys that verify an app's registration
/// tickets (docs/security.md). Isle stores only public keys; `create` hands the private key to
/// the backend (a file only its owner can read) and never keeps it.
struct TicketKeyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ticket-key",
        abstract: "Keys that verify the registration tickets your backend signs (the backend keeps the private key).",
        subcommands: [Create.self, Import.self, List.self, Remove.self])

    static func app(_ store: any AppRepository, _ bundleID: String, _ shown: String) async throws -> AppRecord {
        guard let app = try await store.app(bundleID) else { throw CLIError("no app \(bundleID) in \(shown): add it first with isle app add") }
        return app
    }

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Make a P-256 key pair: the public key is stored, the private key written for the backend.")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id")) var bundleID: String
        @Option(help: ArgumentHelp("Where to write the private key (PEM, created 0600). Without it, the PEM is printed.", valueName: "file")) var out: String?

        func run() async throws {
            let (privatePEM, key) = RegistrationTicket.makeKey(now: CLIContext.current.now())
            if let out {
                guard !FileManager.default.fileExists(atPath: out) else { throw CLIError("--out: \(out) exists; Isle never overwrites a key file") }
                guard FileManager.default.createFile(atPath: out, contents: Data((privatePEM + "\n").utf8), attributes: [.posixPermissions: 0o600]) else {
                    throw CLIError("--out: cannot write \(out)")
                }
            }
            let shown = database.shownPath
            let bundleID = bundleID
            try await database.withStore { store in
                var app = try await TicketKeyCommand.app(store, bundleID, shown)
                app.ticketKeys.append(key)
                try await store.upsertApp(app)
            }
            if out == nil { say(privatePEM) }
            warn("ticket key \(key.id) of \(bundleID) saved in \(shown)\(out.map { "; its private key is in \($0) — give it to your backend only" } ?? "; the private key above is for your backend only: Isle did not keep it")")
            say(key.id)
        }
    }

    struct Import: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Store the public key of a pair your backend made (a P-256 public or private key in PEM; only the public part is kept).")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id")) var bundleID: String
        @Option(name: .customLong("public-key"), help: ArgumentHelp("The PEM file.", valueName: "file")) var publicKey: String
        @Option(help: "The key's id, as the backend's tickets name it in their kid header (default: a new one).") var id: String?

        func run() async throws {
            let text = String(decoding: try Inputs.read(publicKey, flag: "--public-key"), as: UTF8.self)
            guard let pem = RegistrationTicket.publicKeyPEM(of: text) else { throw CLIError("--public-key: \(publicKey) is not a P-256 (ES256) key in PEM") }
            if let id, id.isEmpty || id.count > 64 || id.contains(where: \.isWhitespace) { throw CLIError("--id: 1 to 64 characters, no spaces") }
            let key = TicketKey(id: id ?? RegistrationTicket.makeKey(now: Date()).key.id, publicKeyPEM: pem, createdAt: CLIContext.current.now())
            let shown = database.shownPath
            let bundleID = bundleID
            try await database.withStore { store in
                var app = try await TicketKeyCommand.app(store, bundleID, shown)
                guard !app.ticketKeys.contains(where: { $0.id == key.id }) else { throw CLIError("--id: \(bundleID) already has a ticket key \(key.id)") }
                app.ticketKeys.append(key)
                try await store.upsertApp(app)
            }
            say(key.id)
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List an app's ticket keys.")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id")) var bundleID: String
        func run() async throws {
            let shown = database.shownPath
            let bundleID = bundleID
            let app = try await database.withStore { try await TicketKeyCommand.app($0, bundleID, shown) }
            if app.ticketKeys.isEmpty { warn("\(bundleID) has no ticket key: isle app ticket-key create --bundle-id \(bundleID) --out ticket-key.pem") }
            let f = ISO8601DateFormatter()
            for k in app.ticketKeys { say("\(k.id)  added \(f.string(from: k.createdAt))") }
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Remove a ticket key: tickets signed with it are refused from then on.")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id")) var bundleID: String
        @Option var id: String
        func run() async throws {
            let shown = database.shownPath
            let (bundleID, id) = (bundleID, id)
            try await database.withStore { store in
                var app = try await TicketKeyCommand.app(store, bundleID, shown)
                guard app.ticketKeys.contains(where: { $0.id == id }) else { throw CLIError("--id: \(bundleID) has no ticket key \(id)") }
                app.ticketKeys.removeAll { $0.id == id }
                try await store.upsertApp(app)
            }
            say("ticket key \(id) removed")
        }
    }
}

/// `isle ticket`: signs a registration ticket, as a backend does — for shell walkthroughs and
/// for checking a backend's own tickets against Isle.
struct TicketCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ticket",
        abstract: "Sign a registration ticket (what your backend gives the app so it may bind an order key or a user).")
    @Option(help: ArgumentHelp("The ticket key's private PEM (from isle app ticket-key create --out).", valueName: "file")) var key: String
    @Option(name: .customLong("key-id"), help: "The ticket key's id (printed by ticket-key create / list).") var keyID: String
    @Option(name: .customLong("bundle-id")) var bundleID: String
    @Option(name: .customLong("external-key"), help: "The activity's key, e.g. an order id.") var externalKey: String?
    @Option(help: "The installation's user.") var user: String?
    @Option(help: "Only this installation may present it.") var installation: String?
    @Option(help: "Seconds until it expires (at most 86400).") var ttl: Int = 600

    func run() async throws {
        guard externalKey != nil || user != nil else { throw CLIError("give --external-key and/or --user: a ticket names what it binds") }
        guard (1...Int(RegistrationTicket.maximumLifetime)).contains(ttl) else { throw CLIError("--ttl: 1 to 86400 seconds (tickets are short-lived)") }
        let pem = String(decoding: try Inputs.read(key, flag: "--key"), as: UTF8.self)
        guard let signing = try? P256.Signing.PrivateKey(pemRepresentation: pem) else { throw CLIError("--key: \(key) is not a P-256 private key in PEM") }
        let ticket = RegistrationTicket(bundleID: bundleID, expires: CLIContext.current.now().addingTimeInterval(TimeInterval(ttl)), externalKey: externalKey, userID: user,
                                        installationID: installation)
        say(try ticket.signed(with: signing, keyID: keyID))
    }
}
