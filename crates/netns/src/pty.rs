//! Pseudo-terminals for programs run with a terminal (`kubectl exec -t`): a master the caller
//! reads and writes, a slave that becomes the program's stdin, stdout and stderr (and, with
//! [`crate::sandbox::Sandbox::controlling_tty`], its controlling terminal), and the window size.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use nix::pty::{Winsize, openpty};

/// A new pseudo-terminal of `rows` × `cols` (0 × 0: the kernel's default).
#[derive(Debug)]
pub struct Pty {
    pub master: File,
    pub slave: File,
}

nix::ioctl_write_ptr_bad!(set_winsize, nix::libc::TIOCSWINSZ, Winsize);
nix::ioctl_write_int_bad!(set_controlling, nix::libc::TIOCSCTTY);

impl Pty {
    pub fn open(rows: u16, cols: u16) -> io::Result<Pty> {
        let size = Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pair = openpty(Some(&size), None).map_err(io::Error::from)?;
        Ok(Pty {
            master: File::from(pair.master),
            slave: File::from(pair.slave),
        })
    }
}

/// Sets the window size of the terminal whose master (or slave) is `tty`; the program on it
/// gets SIGWINCH.
pub fn resize(tty: &File, rows: u16, cols: u16) -> io::Result<()> {
    let size = Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one Winsize from the pointer, which lives across the call.
    #[allow(unsafe_code)]
    unsafe { set_winsize(tty.as_raw_fd(), &size) }.map_err(io::Error::from)?;
    Ok(())
}

/// Makes the terminal open as `fd` the calling process's controlling terminal. Only for a
/// forked child that has just called `setsid` (see the sandbox).
pub(crate) fn make_controlling(fd: i32) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal from another session).
    #[allow(unsafe_code)]
    unsafe { set_controlling(fd, 0) }.map_err(io::Error::from)?;
    Ok(())
}
