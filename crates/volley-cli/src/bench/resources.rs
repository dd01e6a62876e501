//! What the process spends while measured: CPU time (the whole process's, and the in-process
//! server thread's), resident memory and the heap the program holds.

/// User + system CPU seconds of this process so far.
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct we pass; zeroed is a valid `rusage`.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// CPU time of the in-process server's thread (`--runtime split`), read from another thread
/// through the thread's CPU clock.
pub mod server_cpu {
    use std::sync::OnceLock;

    static CLOCK: OnceLock<libc::clockid_t> = OnceLock::new();

    /// Called on the server's thread before it starts serving.
    pub fn register_this_thread() {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: pthread_self is always valid; the call writes only `clock`.
        if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } == 0 {
            let _ = CLOCK.set(clock);
        }
    }

    /// CPU seconds the server's thread has used (None without a registered server thread).
    pub fn seconds() -> Option<f64> {
        let clock = *CLOCK.get()?;
        // SAFETY: clock_gettime writes only the struct we pass; zeroed is a valid timespec.
        let mut t: libc::timespec = unsafe { std::mem::zeroed() };
        (unsafe { libc::clock_gettime(clock, &mut t) } == 0).then(|| t.tv_sec as f64 + t.tv_nsec as f64 / 1e9)
    }
}

/// Heap memory the program holds, in KiB: what the system allocator has handed out and not
/// taken back (glibc only; `None` under mimalloc, jemalloc or another libc).
pub fn heap_in_use_kb() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if crate::GLOBAL_ALLOCATOR == "system" {
        // SAFETY: mallinfo2 only reads the allocator's own statistics.
        let m = unsafe { libc::mallinfo2() };
        return Some(((m.uordblks + m.hblkhd) / 1024) as u64);
    }
    None
}

/// Resident memory of this process in KiB (0 where /proc is not available).
pub fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4)
}
