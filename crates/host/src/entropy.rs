//! Entropy for the guest's virtio-rng, from the host kernel's pool.

use std::io;

/// Fills `buf` from getrandom(2). Blocks only while the kernel's pool is
/// not yet initialised (early boot), never afterwards.
pub fn fill(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: the pointer and length describe `rest`, which is valid
        // for writes for its whole length.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // Large requests may be answered in parts (at most 32 MiB a call,
        // or less when a signal arrives).
        done += n as usize;
    }
    Ok(())
}
