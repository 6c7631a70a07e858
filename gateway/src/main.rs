//! `gateway`: the server binary.

use gateway::cli::{CliError, Command, Parsed};

/// mimalloc: a request allocates and frees many small objects (parsed JSON, headers, futures);
/// under glibc's malloc that was about a quarter of the gate path's instructions.
#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// mimalloc through its plain entry points where the alignment allows. The `mimalloc` crate's
/// allocator always calls `mi_malloc_aligned`, about 65 instructions where `mi_malloc` takes a
/// fraction of that; a rejected request allocates about 30 times.
struct MiMalloc;

/// The alignment every `mi_malloc` block of at least this size has (`MI_MAX_ALIGN_SIZE`).
const MI_MIN_ALIGN: usize = 16;

impl MiMalloc {
    /// Whether `mi_malloc`'s guarantee covers the layout: blocks of 16 bytes or more are
    /// 16-aligned and smaller ones 8-aligned, so an alignment of at most 16 and at most the
    /// size is always met (the rule Rust's own `System` allocator uses).
    fn plain(layout: std::alloc::Layout) -> bool {
        layout.align() <= MI_MIN_ALIGN && layout.align() <= layout.size()
    }
}

// SAFETY: every pointer handed out comes from mimalloc with at least the layout's alignment
// (checked by `plain`, or asked of the aligned entry points) and goes back to `mi_free` /
// mimalloc's realloc, which accept pointers from any of its allocation functions.
unsafe impl std::alloc::GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: plain FFI calls; mimalloc returns null on failure, as GlobalAlloc expects.
        unsafe {
            if Self::plain(layout) {
                libmimalloc_sys::mi_malloc(layout.size()).cast()
            } else {
                libmimalloc_sys::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe {
            if Self::plain(layout) {
                libmimalloc_sys::mi_zalloc(layout.size()).cast()
            } else {
                libmimalloc_sys::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from this allocator.
        unsafe { libmimalloc_sys::mi_free(ptr.cast()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator; the new block keeps the alignment (checked
        // against the new size for the plain path).
        unsafe {
            let new_layout =
                std::alloc::Layout::from_size_align_unchecked(new_size, layout.align());
            if Self::plain(new_layout) {
                libmimalloc_sys::mi_realloc(ptr.cast(), new_size).cast()
            } else {
                libmimalloc_sys::mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast()
            }
        }
    }
}

fn main() -> std::process::ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    let Parsed { cli, review } = match gateway::cli::parse(argv) {
        Ok(parsed) => parsed,
        Err(CliError::Clap(e)) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            return std::process::ExitCode::from(2);
        }
    };
    let level = match &cli.command {
        Command::Serve(args) => args.log_filter(),
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr)
        .init();
    for line in review.warnings() {
        tracing::warn!("{line}");
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let code = match cli.command {
        Command::Serve(args) => match rt.block_on(gateway::serve::run(*args)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::ExitCode::from(2)
            }
        },
        Command::Contract(args) => rt.block_on(gateway::contract_cmd::run(args)),
        Command::UpgradeCheck(args) => rt.block_on(gateway::upgrade_check::run(args)),
        Command::Preload(args) => match rt.block_on(gateway::preload::run(args)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::ExitCode::from(2)
            }
        },
    };
    // Whatever is still open after the drain (connections, blocking media work) is dropped,
    // not waited for.
    rt.shutdown_background();
    code
}

/// The first line of a command-line error: clap adds usage and tips below it, and a start-up
/// error here is one line.
fn one_line(e: &CliError) -> String {
    let text = match e {
        CliError::Clap(e) => e.render().to_string(),
        CliError::Refused(why) => why.clone(),
    };
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let line = lines.next().unwrap_or("").trim_start_matches("error: ");
    // clap lists what a line ending in a colon is about on the next one (the missing
    // arguments): keep it on the same line.
    match (line.strip_suffix(':'), lines.next()) {
        (Some(head), Some(next)) => format!("{head}: {}", next.trim()),
        _ => line.to_string(),
    }
}
