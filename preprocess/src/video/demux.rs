//! An FFmpeg demuxer over bytes in memory.
//!
//! A custom `AVIOContext` reads from the caller's slice through read and seek
//! callbacks, so no temporary file is written. The callbacks and FFmpeg's
//! interrupt callback check the decode's [`Deadline`], so probing and reading
//! stop when the time budget is spent.
//!
//! The container is probed first and only the demuxers in [`ALLOWED_FORMATS`]
//! are opened, and `io_open` refuses every nested open, so a crafted file
//! (an HLS or concat playlist, an mp4 with external data references) cannot
//! make FFmpeg read other files or URLs.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::marker::PhantomData;
use std::ptr;

use ffmpeg_next::ffi;
use ffmpeg_next::format::context::Input;

use super::{check_size, Deadline, VideoError, VideoLimits};

/// Demuxers we open (FFmpeg's short names; one match in a demuxer's
/// comma-separated name list is enough).
pub(crate) const ALLOWED_FORMATS: &[&str] = &[
    "mov",
    "mp4",
    "matroska",
    "webm",
    "avi",
    "flv",
    "mpegts",
    "mpeg",
    "ogg",
    "asf",
    "h264",
    "hevc",
    "m4v",
    "ivf",
    "mjpeg",
    "gif",
    "yuv4mpegpipe",
];

/// The AVIO buffer FFmpeg reads through.
const AVIO_BUFFER: usize = 64 * 1024;

/// What the callbacks see: the bytes, a cursor, and the deadline.
struct ReadState {
    data: *const u8,
    len: usize,
    pos: Cell<usize>,
    deadline: Deadline,
    timed_out: Cell<bool>,
}

impl ReadState {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `data`/`len` come from a live `&[u8]` whose lifetime the
        // owning `MemoryInput<'a>` carries; the state never outlives it.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }

    fn out_of_time(&self) -> bool {
        if self.deadline.passed() {
            self.timed_out.set(true);
            true
        } else {
            false
        }
    }
}

/// `read_packet` for `avio_alloc_context`.
unsafe extern "C" fn read_packet(opaque: *mut c_void, buf: *mut u8, buf_size: c_int) -> c_int {
    // SAFETY: `opaque` is the `ReadState` handed to `avio_alloc_context`,
    // alive until after the `AVIOContext` is freed (see `MemoryInput::drop`).
    let state = unsafe { &*(opaque as *const ReadState) };
    if state.out_of_time() {
        return ffi::AVERROR_EXIT;
    }
    let pos = state.pos.get();
    let want = usize::try_from(buf_size).unwrap_or(0);
    let Some(rest) = state.bytes().get(pos..) else {
        return ffi::AVERROR_EOF;
    };
    let n = rest.len().min(want);
    if n == 0 || buf.is_null() {
        return ffi::AVERROR_EOF;
    }
    // SAFETY: FFmpeg hands a buffer of `buf_size` writable bytes; n <= buf_size.
    let dst = unsafe { std::slice::from_raw_parts_mut(buf, n) };
    dst.copy_from_slice(&rest[..n]);
    state.pos.set(pos + n);
    // n <= buf_size, a c_int.
    n as c_int
}

/// `seek` for `avio_alloc_context` (SEEK_SET/CUR/END and AVSEEK_SIZE).
unsafe extern "C" fn seek(opaque: *mut c_void, offset: i64, whence: c_int) -> i64 {
    // SAFETY: as in `read_packet`.
    let state = unsafe { &*(opaque as *const ReadState) };
    let len = i64::try_from(state.len).unwrap_or(i64::MAX);
    let whence = whence & !ffi::AVSEEK_FORCE;
    let base = match whence {
        ffi::AVSEEK_SIZE => return len,
        0 => 0,                                                  // SEEK_SET
        1 => i64::try_from(state.pos.get()).unwrap_or(i64::MAX), // SEEK_CUR
        2 => len,                                                // SEEK_END
        _ => return i64::from(ffi::AVERROR(ffmpeg_next::util::error::EINVAL)),
    };
    match base.checked_add(offset) {
        Some(target) if target >= 0 => {
            let clamped = target.min(len);
            // 0 <= clamped <= len = state.len, a usize.
            state.pos.set(clamped as usize);
            clamped
        }
        _ => i64::from(ffi::AVERROR(ffmpeg_next::util::error::EINVAL)),
    }
}

/// `AVFormatContext.interrupt_callback`: nonzero stops blocking work.
unsafe extern "C" fn interrupt(opaque: *mut c_void) -> c_int {
    // SAFETY: as in `read_packet`.
    let state = unsafe { &*(opaque as *const ReadState) };
    c_int::from(state.out_of_time())
}

/// `AVFormatContext.io_open`: refuses every nested open (playlists, drefs).
unsafe extern "C" fn refuse_open(
    _s: *mut ffi::AVFormatContext,
    _pb: *mut *mut ffi::AVIOContext,
    _url: *const c_char,
    _flags: c_int,
    _options: *mut *mut ffi::AVDictionary,
) -> c_int {
    ffi::AVERROR(ffmpeg_next::util::error::EPERM)
}

/// An opened demuxer reading from `&'a [u8]`. Dropping it closes the format
/// context, then frees the AVIO context and its buffer, then the read state.
pub(crate) struct MemoryInput<'a> {
    input: Option<Input>,
    avio: *mut ffi::AVIOContext,
    state: *mut ReadState,
    _bytes: PhantomData<&'a [u8]>,
}

impl<'a> MemoryInput<'a> {
    /// Probes, checks the container against [`ALLOWED_FORMATS`], opens it,
    /// checks every video stream's size as the container states it (before
    /// FFmpeg decodes anything), and reads the stream info with the
    /// decoders' pixel cap set.
    pub(crate) fn open(
        bytes: &'a [u8],
        deadline: Deadline,
        limits: &VideoLimits,
    ) -> Result<Self, VideoError> {
        let state = Box::into_raw(Box::new(ReadState {
            data: bytes.as_ptr(),
            len: bytes.len(),
            pos: Cell::new(0),
            deadline,
            timed_out: Cell::new(false),
        }));
        // From here on `this` owns everything allocated, and its Drop frees it
        // on every early return.
        let mut this = MemoryInput {
            input: None,
            avio: ptr::null_mut(),
            state,
            _bytes: PhantomData,
        };
        // SAFETY: plain allocation; checked for null below.
        let buffer = unsafe { ffi::av_malloc(AVIO_BUFFER) } as *mut u8;
        if buffer.is_null() {
            return Err(VideoError::Decode("out of memory".to_owned()));
        }
        // SAFETY: `buffer` is AVIO_BUFFER bytes from av_malloc; `state` stays
        // alive (owned by `this`) until after the AVIO context is freed.
        this.avio = unsafe {
            ffi::avio_alloc_context(
                buffer,
                AVIO_BUFFER as c_int,
                0,
                state as *mut c_void,
                Some(read_packet),
                None,
                Some(seek),
            )
        };
        if this.avio.is_null() {
            // SAFETY: the buffer was not handed over; free it here.
            unsafe { ffi::av_free(buffer as *mut c_void) };
            return Err(VideoError::Decode("out of memory".to_owned()));
        }

        let mut format: *const ffi::AVInputFormat = ptr::null();
        // SAFETY: `this.avio` is a valid reading AVIO context; `format`
        // receives a pointer to a static demuxer description.
        let score = unsafe {
            ffi::av_probe_input_buffer2(this.avio, &mut format, c"".as_ptr(), ptr::null_mut(), 0, 0)
        };
        if score < 0 || format.is_null() {
            return Err(this.failure(score, "unknown or invalid container"));
        }
        // SAFETY: a non-null AVInputFormat from the probe has a static,
        // NUL-terminated `name`.
        let name = unsafe { CStr::from_ptr((*format).name) }
            .to_string_lossy()
            .into_owned();
        if !name.split(',').any(|n| ALLOWED_FORMATS.contains(&n)) {
            return Err(VideoError::Decode(format!(
                "the container format '{name}' is not supported"
            )));
        }

        // SAFETY: allocation; checked for null below.
        let mut ctx = unsafe { ffi::avformat_alloc_context() };
        if ctx.is_null() {
            return Err(VideoError::Decode("out of memory".to_owned()));
        }
        // SAFETY: `ctx` is a fresh context we own; we set the custom IO (which
        // FFmpeg will not free because of AVFMT_FLAG_CUSTOM_IO), the interrupt
        // callback over our state, and the nested-open refusal.
        let ret = unsafe {
            (*ctx).pb = this.avio;
            (*ctx).flags |= ffi::AVFMT_FLAG_CUSTOM_IO;
            (*ctx).interrupt_callback = ffi::AVIOInterruptCB {
                callback: Some(interrupt),
                opaque: state as *mut c_void,
            };
            (*ctx).io_open = Some(refuse_open);
            // On failure this frees `ctx` and sets it to null.
            ffi::avformat_open_input(&mut ctx, ptr::null(), format, ptr::null_mut())
        };
        if ret < 0 || ctx.is_null() {
            return Err(this.failure(ret, "cannot read the container"));
        }
        // SAFETY: `ctx` is an opened input context; `Input` closes it on drop
        // (before our Drop frees the AVIO context).
        this.input = Some(unsafe { Input::wrap(ctx) });
        check_claimed_sizes(this.input()?, limits)?;
        find_stream_info(ctx, limits)
            .map_err(|ret| this.failure(ret, "cannot read the stream info"))?;
        Ok(this)
    }

    pub(crate) fn input(&self) -> Result<&Input, VideoError> {
        self.input
            .as_ref()
            .ok_or_else(|| VideoError::Decode("the demuxer is closed".to_owned()))
    }

    pub(crate) fn input_mut(&mut self) -> Result<&mut Input, VideoError> {
        self.input
            .as_mut()
            .ok_or_else(|| VideoError::Decode("the demuxer is closed".to_owned()))
    }

    /// Whether a read stopped because the deadline passed.
    pub(crate) fn timed_out(&self) -> bool {
        // SAFETY: `state` is alive for as long as `self`.
        unsafe { (*self.state).timed_out.get() }
    }

    /// The error for a failed FFmpeg call: the timeout if the deadline passed.
    pub(crate) fn failure(&self, code: c_int, what: &str) -> VideoError {
        // SAFETY: `state` is alive for as long as `self`.
        let deadline = unsafe { (*self.state).deadline };
        if self.timed_out() || deadline.passed() {
            return deadline.error();
        }
        if code < 0 {
            VideoError::Decode(format!("{what} ({})", ffmpeg_next::Error::from(code)))
        } else {
            VideoError::Decode(what.to_owned())
        }
    }
}

/// Refuses a video stream whose stated size is over the caps (a size of 0,
/// not yet known, is left to the stream info).
fn check_claimed_sizes(input: &Input, limits: &VideoLimits) -> Result<(), VideoError> {
    for stream in input.streams() {
        // SAFETY: the stream belongs to the open context; libavformat
        // allocates `codecpar` for every stream.
        let (kind, width, height) = unsafe {
            let par = (*stream.as_ptr()).codecpar;
            if par.is_null() {
                continue;
            }
            ((*par).codec_type, (*par).width, (*par).height)
        };
        if kind != ffi::AVMediaType::AVMEDIA_TYPE_VIDEO || width <= 0 || height <= 0 {
            continue;
        }
        check_size(
            u32::try_from(width).unwrap_or(u32::MAX),
            u32::try_from(height).unwrap_or(u32::MAX),
            limits,
        )?;
    }
    Ok(())
}

/// `avformat_find_stream_info` with `max_pixels` and one thread for the
/// decoders it opens while probing; the FFmpeg error code on failure.
fn find_stream_info(ctx: *mut ffi::AVFormatContext, limits: &VideoLimits) -> Result<(), c_int> {
    let max_pixels = CString::new(limits.max_pixels_per_frame.min(i64::MAX as u64).to_string())
        .map_err(|_| ffi::AVERROR(ffmpeg_next::util::error::EINVAL))?;
    // SAFETY: `ctx` is an open input context.
    let count = unsafe { (*ctx).nb_streams } as usize;
    let mut options: Vec<*mut ffi::AVDictionary> = vec![ptr::null_mut(); count];
    for dict in options.iter_mut() {
        // SAFETY: av_dict_set allocates or extends `*dict`, freed below.
        unsafe {
            ffi::av_dict_set(dict, c"max_pixels".as_ptr(), max_pixels.as_ptr(), 0);
            ffi::av_dict_set(dict, c"threads".as_ptr(), c"1".as_ptr(), 0);
        }
    }
    let options_ptr = if options.is_empty() {
        ptr::null_mut()
    } else {
        options.as_mut_ptr()
    };
    // SAFETY: `options` holds one dictionary per stream, as the API requires.
    let ret = unsafe { ffi::avformat_find_stream_info(ctx, options_ptr) };
    for dict in options.iter_mut() {
        // SAFETY: each dictionary came from av_dict_set (or is null).
        unsafe { ffi::av_dict_free(dict) };
    }
    if ret < 0 {
        Err(ret)
    } else {
        Ok(())
    }
}

impl Drop for MemoryInput<'_> {
    fn drop(&mut self) {
        // Close the format context first: it may still read through the AVIO.
        drop(self.input.take());
        if !self.avio.is_null() {
            // SAFETY: we allocated `avio` and its buffer (FFmpeg may have
            // replaced the buffer; it stays owned by the context, so free the
            // current one); nothing references them once the input is closed.
            unsafe {
                ffi::av_freep(ptr::addr_of_mut!((*self.avio).buffer) as *mut c_void);
                ffi::avio_context_free(&mut self.avio);
            }
        }
        if !self.state.is_null() {
            // SAFETY: from Box::into_raw in `open`; freed once, last.
            drop(unsafe { Box::from_raw(self.state) });
            self.state = ptr::null_mut();
        }
    }
}
