//! The C API of libnftables 1.0 (`<nftables/libnftables.h>`, symbol version `LIBNFTABLES_1`),
//! resolved at run time with `dlopen`/`dlsym`, and one context over it. The only `unsafe` of
//! this crate is here: seven functions, each called with a live context pointer, and the
//! `memfd_create` the commands are handed over in.
//!
//! Loaded at run time rather than linked, so that the `svcnet` binary starts (and runs the
//! iptables and userspace modes) on a host without the library, and a missing library is an
//! error the nftables mode reports, not a loader failure before `main`. Building needs no
//! `-dev` package either.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::fs::File;
use std::io::{Seek, Write};
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// The library's soname (Debian: package `libnftables1`, which `nftables` depends on).
pub const SONAME: &str = "libnftables.so.1";

type CtxNew = unsafe extern "C" fn(u32) -> *mut c_void;
type CtxFree = unsafe extern "C" fn(*mut c_void);
type CtxInt = unsafe extern "C" fn(*mut c_void) -> c_int;
type CtxStr = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type RunCmd = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;

/// The functions used, from the loaded library.
struct Api {
    ctx_new: CtxNew,
    ctx_free: CtxFree,
    buffer_output: CtxInt,
    buffer_error: CtxInt,
    output_buffer: CtxStr,
    error_buffer: CtxStr,
    run_cmd_from_filename: RunCmd,
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// libnftables 1.0.6 keeps process-wide state besides its contexts: `nft_ctx_new` guards its
/// one-time initialisation (gmp, xtables) with an unsynchronised static flag, and
/// `nft_ctx_free` releases a global interface cache that another context may be using. So
/// every call into the library holds this lock. Contexts of different namespaces (`svcnet up`
/// runs one proxy per node in one process) take turns; a one-element commit holds it for well
/// under a millisecond.
static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The last `dlerror()` text of this thread.
fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by libc, valid until the
    // next dl* call of this thread; it is copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

fn load() -> Result<Api, String> {
    let name = CString::new(SONAME).map_err(|e| e.to_string())?;
    // SAFETY: a valid C string. The handle is never closed, so the symbols stay valid for the
    // life of the process.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(dlerror());
    }
    let sym = |s: &str| -> Result<*mut c_void, String> {
        let c = CString::new(s).map_err(|e| e.to_string())?;
        // SAFETY: a live handle and a valid C string.
        let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
        if p.is_null() {
            Err(format!("{SONAME} has no symbol {s}: {}", dlerror()))
        } else {
            Ok(p)
        }
    };
    // SAFETY: each pointer is the function of that name in libnftables' stable ABI, given the
    // signature `libnftables.h` declares for it.
    unsafe {
        Ok(Api {
            ctx_new: std::mem::transmute::<*mut c_void, CtxNew>(sym("nft_ctx_new")?),
            ctx_free: std::mem::transmute::<*mut c_void, CtxFree>(sym("nft_ctx_free")?),
            buffer_output: std::mem::transmute::<*mut c_void, CtxInt>(sym(
                "nft_ctx_buffer_output",
            )?),
            buffer_error: std::mem::transmute::<*mut c_void, CtxInt>(sym("nft_ctx_buffer_error")?),
            output_buffer: std::mem::transmute::<*mut c_void, CtxStr>(sym(
                "nft_ctx_get_output_buffer",
            )?),
            error_buffer: std::mem::transmute::<*mut c_void, CtxStr>(sym(
                "nft_ctx_get_error_buffer",
            )?),
            run_cmd_from_filename: std::mem::transmute::<*mut c_void, RunCmd>(sym(
                "nft_run_cmd_from_filename",
            )?),
        })
    }
}

/// Loads the library once per process; the error is `dlerror()`'s text.
pub fn api() -> Result<(), String> {
    loaded().map(|_| ())
}

fn loaded() -> Result<&'static Api, String> {
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Copies a buffer the library owns (valid until the next write to it).
///
/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: the caller's promise.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// One nftables context (`struct nft_ctx`) with output and errors buffered. It opens its
/// netlink socket when created, in the network namespace of the creating thread, and keeps it:
/// create it on a thread inside the namespace it is to program. Not `Send` (a raw pointer):
/// it stays on the thread that made it.
pub struct Context {
    api: &'static Api,
    ctx: NonNull<c_void>,
    /// The commands go to the library as a file (`/proc/self/fd/<n>` of this memfd), as `nft
    /// -f` reads them: libnftables 1.0.6 reports errors in a buffer's later lines against its
    /// first line and without a location, and from a file exactly as `nft -f` does
    /// (`<file>:2:22-27: Error: …` under the right line).
    input: File,
    path: CString,
}

impl Context {
    /// A new context (`nft_ctx_new(NFT_CTX_DEFAULT)`, which opens the netlink socket).
    pub fn new() -> Result<Self, String> {
        let api = loaded()?;
        let _held = lock();
        // SAFETY: NFT_CTX_DEFAULT (0) is a valid flag set.
        let raw = unsafe { (api.ctx_new)(0) };
        let ctx = NonNull::new(raw).ok_or("nft_ctx_new returned no context")?;
        let input = match memfd() {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: the context was just made and is not used again.
                unsafe { (api.ctx_free)(ctx.as_ptr()) };
                return Err(format!("memfd_create: {e}"));
            }
        };
        let path = CString::new(format!("/proc/self/fd/{}", input.as_raw_fd()))
            .map_err(|e| e.to_string())?;
        let this = Self {
            api,
            ctx,
            input,
            path,
        };
        // SAFETY: a live context; buffering makes the library write into memory it owns
        // instead of this process's stdout and stderr.
        let (out, err) = unsafe {
            (
                (api.buffer_output)(ctx.as_ptr()),
                (api.buffer_error)(ctx.as_ptr()),
            )
        };
        if out != 0 || err != 0 {
            return Err("nft_ctx_buffer_output/error failed".into());
        }
        Ok(this)
    }

    /// Runs `commands` (nft's language, as `nft -f` reads it; a batch is one atomic
    /// transaction). `Ok` with what the library printed (a listing), or `Err` with its error
    /// text, which is what `nft -f` prints on stderr.
    pub fn run(&mut self, commands: &str) -> Result<String, String> {
        let staged = (|| -> std::io::Result<()> {
            self.input.set_len(0)?;
            self.input.rewind()?;
            self.input.write_all(commands.as_bytes())
        })();
        staged.map_err(|e| format!("handing the commands to libnftables: {e}"))?;
        let result = {
            let _held = lock();
            let p = self.ctx.as_ptr();
            // SAFETY: a live context and a valid C string naming a readable file; the buffers
            // are read (copied) before anything else writes to them, under the lock.
            unsafe {
                let rc = (self.api.run_cmd_from_filename)(p, self.path.as_ptr());
                let out = text((self.api.output_buffer)(p));
                let err = text((self.api.error_buffer)(p));
                if rc == 0 {
                    Ok(out)
                } else if err.trim().is_empty() {
                    Err(format!(
                        "libnftables failed (return code {rc}) without a message"
                    ))
                } else {
                    Err(err)
                }
            }
        };
        // A full sync's text should not stay in memory until the next command.
        let _ = self.input.set_len(0);
        result
    }
}

/// Gives the memory malloc holds free back to the system (glibc's `malloc_trim`). A full
/// sync at 30k services makes libnftables allocate about a gigabyte while it parses and
/// frees it at the end; glibc keeps freed memory of a thread's arena mapped, so without this
/// the proxy's resident size would stay at its largest sync's peak.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and releases malloc's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// An anonymous in-memory file, closed on exec (Linux; libnftables is Linux-only anyway).
#[cfg(not(target_os = "linux"))]
fn memfd() -> std::io::Result<File> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// An anonymous in-memory file, closed on exec.
#[cfg(target_os = "linux")]
fn memfd() -> std::io::Result<File> {
    use std::os::fd::FromRawFd;
    let name = CString::new("svcnet-nft").map_err(std::io::Error::other)?;
    // SAFETY: a valid C string and flags; the returned descriptor is owned by the File.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

impl Drop for Context {
    fn drop(&mut self) {
        let _held = lock();
        // SAFETY: the context is live and never used again.
        unsafe { (self.api.ctx_free)(self.ctx.as_ptr()) }
    }
}
