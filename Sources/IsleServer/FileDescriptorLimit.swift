#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The process's open-file limit (docs/security.md, "Connections"). Every connection is a file
/// descriptor, and the soft limit most systems start a process with (1,024) is far below what a
/// server holding many idle keep-alive connections needs; `isle serve` raises it to the hard limit
/// at start (which the systemd unit sets with `LimitNOFILE=`).
public enum FileDescriptorLimit {
    /// Raises the soft limit to the hard one (at most `ceiling`); the limits after.
    @discardableResult
    public static func raise(ceiling: UInt64 = 1 << 20) -> (soft: UInt64, hard: UInt64)? {
        var limit = rlimit()
        #if canImport(Darwin)
        let resource = RLIMIT_NOFILE
        #else
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        #endif
        guard getrlimit(resource, &limit) == 0 else { return nil }
        let target = min(UInt64(limit.rlim_max), ceiling)
        if UInt64(limit.rlim_cur) < target {
            var raised = limit
            raised.rlim_cur = rlim_t(target)
            if setrlimit(resource, &raised) == 0 { limit = raised }
        }
        return (UInt64(limit.rlim_cur), UInt64(limit.rlim_max))
    }
}
