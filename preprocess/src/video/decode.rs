//! Decoding a container with FFmpeg and keeping the sampled frames.
//!
//! 1. Open the bytes ([`MemoryInput`]), pick the best video stream and check
//!    its width, height and pixels from the codec parameters, before any
//!    frame is decoded; refuse a claimed frame count over the scan cap.
//! 2. Walk the packets once without decoding (cheap) to count the video's
//!    frames and collect their presentation timestamps, under the scan cap
//!    and the time budget.
//! 3. Choose the indices ([`sample_indices`]), check the output caps, reopen
//!    and decode in order, converting to RGB only the frames kept, and stop
//!    after the last one.
//!
//! In step 3 a frame's index is the rank of its timestamp among all packets'
//! (the frame's position in presentation order), which allows two savings
//! that leave the kept frames bit-identical to a full decode:
//!
//! * a packet whose frame is not kept is decoded with
//!   `skip_frame = AVDISCARD_NONREF`, so a frame that no other frame
//!   references (most B-frames) is skipped;
//! * between two clean cuts (an H.264/HEVC IDR, a VP8/VP9 key frame: no later
//!   packet refers to an earlier one) only the packets up to the last kept
//!   frame are sent ([`send_plan`]), so the rest of a GOP, and GOPs with
//!   nothing kept, are demuxed but never decoded. For a long video with few
//!   frames kept this is most of the work (the effect of seeking to each key
//!   frame, without trusting the container's seek index).
//!
//! If the timestamps are missing or inconsistent (duplicates, a frame whose
//! timestamp matches no packet, a kept frame never seen), the decode falls
//! back to sending every packet and counting every frame in order, as
//! OpenCV's `grab()` loop does.

use std::sync::Once;

use ffmpeg_next::ffi;
use ffmpeg_next::format::Pixel;
use ffmpeg_next::media;
use ffmpeg_next::packet::{Mut as _, Ref as _};
use ffmpeg_next::software::scaling;
use ffmpeg_next::util::frame::Video as VideoFrame;
use ffmpeg_next::{codec, Packet, Rational};
use image::RgbImage;

use super::demux::MemoryInput;
use super::{
    check_output, check_size, sample_indices, Deadline, DecodedVideo, VideoError, VideoHeader,
    VideoIoOptions, VideoLimits,
};

/// What the container says about the video stream.
#[derive(Debug, Clone)]
struct StreamInfo {
    index: usize,
    time_base: f64,
    start_pts: i64,
    fps: f64,
    claimed_frames: u64,
    duration_s: f64,
    width: u32,
    height: u32,
    codec: codec::Id,
    /// NAL length-prefix size of H.264/HEVC in mp4/mkv (`None`: Annex B).
    nal_length_size: Option<usize>,
}

/// The packet walk's findings.
struct Scan {
    /// Presentation timestamps of the video packets, sorted, when every
    /// packet has one and they are distinct.
    sorted_pts: Option<Vec<i64>>,
    frames: usize,
    /// Every video packet in decode order.
    packets: Vec<ScannedPacket>,
}

#[derive(Debug, Clone, Copy)]
struct ScannedPacket {
    /// The timestamp of a frame that is shown (`None`: discarded or unknown).
    pts: Option<i64>,
    /// Decoding can restart cleanly here: no later packet refers to an
    /// earlier one (an H.264/HEVC IDR, a VP8/VP9 key frame).
    cut: bool,
}

/// Why a decode pass stopped short.
enum PassError {
    /// Timestamps do not index the frames; decode again counting frames.
    Inconsistent,
    Failed(VideoError),
}

impl From<VideoError> for PassError {
    fn from(e: VideoError) -> Self {
        PassError::Failed(e)
    }
}

/// The largest single allocation FFmpeg may make. Above any legitimate need
/// here (an 8192x8192 RGBA frame is 256 MiB), and it stops a container whose
/// tables claim billions of entries from reserving gigabytes.
const FFMPEG_MAX_ALLOC: usize = 512 << 20;

/// Once per process: FFmpeg's error strings (ffmpeg-next fills them in
/// `init`), only fatal log messages (every damaged packet of untrusted input
/// would otherwise be logged to stderr), and the allocation cap.
fn init_ffmpeg() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Err(e) = ffmpeg_next::init() {
            tracing::warn!(error = %e, "FFmpeg initialisation failed");
        }
        // SAFETY: both set global integers in libavutil.
        unsafe {
            ffi::av_log_set_level(ffi::AV_LOG_FATAL);
            ffi::av_max_alloc(FFMPEG_MAX_ALLOC);
        }
    });
}

/// The stream's width, height, frame rate and the container's frame count (0 when it has
/// none), from the header alone: no frame is decoded.
pub(crate) fn probe(bytes: &[u8], limits: &VideoLimits) -> Result<VideoHeader, VideoError> {
    init_ffmpeg();
    let input = MemoryInput::open(bytes, Deadline::new(limits.time_budget), limits)?;
    let info = stream_info(&input)?;
    Ok(VideoHeader {
        width: info.width,
        height: info.height,
        fps: info.fps,
        claimed_frames: info.claimed_frames,
    })
}

pub(crate) fn decode(
    bytes: &[u8],
    opts: &VideoIoOptions,
    limits: &VideoLimits,
) -> Result<DecodedVideo, VideoError> {
    init_ffmpeg();
    let deadline = Deadline::new(limits.time_budget);
    let mut input = MemoryInput::open(bytes, deadline, limits)?;
    let info = stream_info(&input)?;
    check_size(info.width, info.height, limits)?;
    if info.claimed_frames > limits.max_total_frames_scanned {
        return Err(VideoError::TooLong {
            frames: info.claimed_frames,
            max: limits.max_total_frames_scanned,
        });
    }
    let scan = scan_packets(&mut input, &info, limits, deadline)?;
    drop(input);
    if scan.frames == 0 {
        return Err(VideoError::Decode("the video has no frames".to_owned()));
    }
    if info.claimed_frames != 0 && info.claimed_frames != scan.frames as u64 {
        tracing::debug!(
            claimed = info.claimed_frames,
            counted = scan.frames,
            "video frame count differs from the container's; using the count"
        );
    }
    let wanted = sample_indices(scan.frames, info.fps, opts);
    check_output(wanted.len(), info.width, info.height, limits)?;

    let result = match scan.sorted_pts.as_deref() {
        Some(pts) => match decode_pass(
            bytes,
            &info,
            &wanted,
            Some(pts),
            Some(&send_plan(&scan.packets, pts, &wanted)),
            limits,
            deadline,
        ) {
            Err(PassError::Inconsistent) => {
                tracing::debug!("video timestamps do not index the frames; decoding every frame");
                decode_pass(bytes, &info, &wanted, None, None, limits, deadline)
            }
            other => other,
        },
        None => decode_pass(bytes, &info, &wanted, None, None, limits, deadline),
    };
    let kept = match result {
        Ok(kept) => kept,
        Err(PassError::Failed(e)) => return Err(e),
        Err(PassError::Inconsistent) => {
            return Err(VideoError::Decode("inconsistent frame order".to_owned()))
        }
    };
    tracing::debug!(
        kept = kept.frames.len(),
        produced = kept.produced,
        total = scan.frames,
        "video decoded"
    );
    if kept.frames.is_empty() {
        return Err(VideoError::Decode(
            kept.error
                .unwrap_or_else(|| "no frame could be decoded".to_owned()),
        ));
    }
    if kept.frames.len() < wanted.len() {
        tracing::warn!(
            wanted = wanted.len(),
            decoded = kept.frames.len(),
            "the video ended before all sampled frames were decoded"
        );
    }
    Ok(DecodedVideo {
        frames: kept.frames,
        timestamps_s: kept.timestamps_s,
        frame_indices: kept.indices,
        source_fps: info.fps,
        total_frames: scan.frames,
        duration_s: if info.duration_s > 0.0 {
            info.duration_s
        } else if info.fps > 0.0 {
            scan.frames as f64 / info.fps
        } else {
            0.0
        },
        width: info.width,
        height: info.height,
    })
}

fn rational(r: Rational) -> f64 {
    if r.denominator() == 0 {
        0.0
    } else {
        f64::from(r.numerator()) / f64::from(r.denominator())
    }
}

fn stream_info(input: &MemoryInput<'_>) -> Result<StreamInfo, VideoError> {
    let ctx = input.input()?;
    let stream = ctx
        .streams()
        .best(media::Type::Video)
        .ok_or_else(|| VideoError::Decode("the file has no video stream".to_owned()))?;
    // SAFETY: the stream belongs to the open context borrowed above; its
    // `codecpar` is allocated by libavformat for every stream.
    let (width, height) = unsafe {
        let par = (*stream.as_ptr()).codecpar;
        if par.is_null() {
            (0, 0)
        } else {
            ((*par).width, (*par).height)
        }
    };
    let width = u32::try_from(width).unwrap_or(0);
    let height = u32::try_from(height).unwrap_or(0);
    let codec = stream.parameters().id();
    // SAFETY: as above; `extradata` holds `extradata_size` bytes when non-null.
    let extradata: Vec<u8> = unsafe {
        let par = (*stream.as_ptr()).codecpar;
        match par.as_ref() {
            Some(par) if !par.extradata.is_null() && par.extradata_size > 0 => {
                let len = usize::try_from(par.extradata_size).unwrap_or(0);
                std::slice::from_raw_parts(par.extradata, len).to_vec()
            }
            _ => Vec::new(),
        }
    };
    // avcC keeps lengthSizeMinusOne in byte 4, hvcC in byte 21; both start with version 1.
    let nal_length_size = match (codec, extradata.first()) {
        (codec::Id::H264, Some(1)) => extradata.get(4).map(|b| usize::from(b & 3) + 1),
        (codec::Id::HEVC, Some(1)) => extradata.get(21).map(|b| usize::from(b & 3) + 1),
        _ => None,
    };
    // SAFETY: both pointers come from the open context and its stream; the
    // call only reads them.
    let guessed = unsafe {
        ffi::av_guess_frame_rate(
            ctx.as_ptr() as *mut ffi::AVFormatContext,
            stream.as_ptr() as *mut ffi::AVStream,
            std::ptr::null_mut(),
        )
    };
    let mut fps = rational(Rational::from(guessed));
    if !(fps.is_finite() && fps > 0.0) {
        fps = rational(stream.avg_frame_rate());
    }
    if !(fps.is_finite() && fps > 0.0) {
        fps = 0.0;
    }
    let time_base = rational(stream.time_base());
    // As OpenCV: the container's duration, else the stream's.
    let mut duration_s = ctx.duration() as f64 / f64::from(ffi::AV_TIME_BASE);
    if !(duration_s.is_finite() && duration_s > 0.0) {
        duration_s = stream.duration() as f64 * time_base;
    }
    if !(duration_s.is_finite() && duration_s > 0.0) {
        duration_s = 0.0;
    }
    let start = stream.start_time();
    Ok(StreamInfo {
        index: stream.index(),
        time_base,
        start_pts: if start == ffi::AV_NOPTS_VALUE {
            0
        } else {
            start
        },
        fps,
        claimed_frames: u64::try_from(stream.frames()).unwrap_or(0),
        duration_s,
        width,
        height,
        codec,
        nal_length_size,
    })
}

/// The packet's presentation timestamp, unless the demuxer marked it discarded
/// (outside an mp4 edit list; the decoder drops such frames).
fn presented(packet: &Packet) -> Option<Option<i64>> {
    // SAFETY: reads the flags of a packet we own.
    let flags = unsafe { (*packet.as_ptr()).flags };
    if flags & ffi::AV_PKT_FLAG_DISCARD != 0 {
        None
    } else {
        Some(packet.pts())
    }
}

/// Reads the next packet: `Ok(None)` at the end of the data (or on a read
/// error after which nothing more can be read, noted in `error`).
fn next_packet(
    input: &mut MemoryInput<'_>,
    packet: &mut Packet,
    scanned: &mut u64,
    limits: &VideoLimits,
    deadline: Deadline,
    error: &mut Option<String>,
) -> Result<bool, VideoError> {
    loop {
        deadline.check()?;
        *scanned += 1;
        if *scanned > limits.max_total_frames_scanned {
            return Err(VideoError::TooLong {
                frames: *scanned,
                max: limits.max_total_frames_scanned,
            });
        }
        // `av_read_frame` wants a blank packet and does not release what the previous read
        // left in it (`Packet::read` does not either): without this each packet leaked.
        // SAFETY: `packet` is a valid packet we own; unref resets it to blank.
        unsafe { ffi::av_packet_unref(packet.as_mut_ptr()) };
        match packet.read(input.input_mut()?) {
            Ok(()) => return Ok(true),
            Err(ffmpeg_next::Error::Eof) => return Ok(false),
            Err(ffmpeg_next::Error::Other { errno })
                if errno == ffmpeg_next::util::error::EAGAIN =>
            {
                continue
            }
            Err(e) => {
                if input.timed_out() {
                    return Err(deadline.error());
                }
                *error = Some(format!("cannot read the container ({e})"));
                return Ok(false);
            }
        }
    }
}

fn scan_packets(
    input: &mut MemoryInput<'_>,
    info: &StreamInfo,
    limits: &VideoLimits,
    deadline: Deadline,
) -> Result<Scan, VideoError> {
    let mut packet = Packet::empty();
    let mut scanned = 0;
    let mut error = None;
    let mut pts = Vec::new();
    let mut all_have_pts = true;
    let mut frames = 0usize;
    let mut packets = Vec::new();
    while next_packet(
        input,
        &mut packet,
        &mut scanned,
        limits,
        deadline,
        &mut error,
    )? {
        if packet.stream() != info.index {
            continue;
        }
        let shown = presented(&packet);
        packets.push(ScannedPacket {
            pts: shown.flatten(),
            cut: is_cut(info, &packet),
        });
        let Some(p) = shown else {
            continue;
        };
        frames += 1;
        match p {
            Some(p) if all_have_pts => pts.push(p),
            _ => all_have_pts = false,
        }
    }
    if let Some(error) = error {
        tracing::debug!(%error, frames, "video packet walk ended early");
    }
    let sorted_pts = if all_have_pts {
        pts.sort_unstable();
        let distinct = pts.windows(2).all(|w| w[0] < w[1]);
        distinct.then_some(pts)
    } else {
        None
    };
    Ok(Scan {
        sorted_pts,
        frames,
        packets,
    })
}

/// Whether decoding can restart cleanly at this packet (see [`ScannedPacket::cut`]).
/// Only codecs where a key frame is known to reset every reference qualify.
fn is_cut(info: &StreamInfo, packet: &Packet) -> bool {
    if !packet.is_key() {
        return false;
    }
    let Some(data) = packet.data() else {
        return false;
    };
    match info.codec {
        codec::Id::VP8 | codec::Id::VP9 => true,
        // nal_unit_type 5: IDR picture.
        codec::Id::H264 => nal_types(data, info.nal_length_size).any(|h| h & 0x1f == 5),
        // nal_unit_type 19, 20: IDR_W_RADL, IDR_N_LP.
        codec::Id::HEVC => {
            nal_types(data, info.nal_length_size).any(|h| matches!((h >> 1) & 0x3f, 19 | 20))
        }
        _ => false,
    }
}

/// The first header byte of each NAL unit in a packet: `length_size`-byte
/// big-endian length prefixes (mp4/mkv, avcC/hvcC extradata), else Annex B
/// start codes.
fn nal_types(data: &[u8], length_size: Option<usize>) -> Box<dyn Iterator<Item = u8> + '_> {
    match length_size {
        Some(size) => {
            let mut pos = 0usize;
            Box::new(std::iter::from_fn(move || {
                let end = pos.checked_add(size)?;
                let len = data
                    .get(pos..end)?
                    .iter()
                    .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
                let header = *data.get(end)?;
                pos = end.checked_add(len)?;
                Some(header)
            }))
        }
        None => Box::new(
            data.windows(4)
                .filter(|w| w[0] == 0 && w[1] == 0 && w[2] == 1)
                .map(|w| w[3]),
        ),
    }
}

/// Which video packets (in decode order) a pass must send to the decoder:
/// between two cuts, those up to the last one whose frame is kept. A packet
/// after that and before the next cut cannot be a reference of any kept
/// frame, so whole runs of frames (the rest of a GOP, GOPs with nothing kept)
/// are never decoded.
fn send_plan(packets: &[ScannedPacket], sorted_pts: &[i64], wanted: &[usize]) -> Vec<bool> {
    let kept = |p: &ScannedPacket| {
        p.pts
            .and_then(|pts| sorted_pts.binary_search(&pts).ok())
            .is_some_and(|rank| wanted.binary_search(&rank).is_ok())
    };
    let mut send = vec![false; packets.len()];
    let mut start = 0;
    for end in 1..=packets.len() {
        let boundary = end == packets.len() || packets.get(end).is_some_and(|p| p.cut);
        if !boundary {
            continue;
        }
        let segment = packets.get(start..end).unwrap_or_default();
        if let Some(last) = segment.iter().rposition(kept) {
            if let Some(run) = send.get_mut(start..=start + last) {
                run.fill(true);
            }
        }
        start = end;
    }
    send
}

/// The frames one pass kept.
struct Kept {
    frames: Vec<RgbImage>,
    timestamps_s: Vec<f64>,
    indices: Vec<usize>,
    /// The last decoding error seen, if any.
    error: Option<String>,
    /// Frames the decoder produced (skipped frames are not produced).
    produced: usize,
}

/// Turns decoded frames into kept RGB images.
struct Keeper<'w> {
    info: &'w StreamInfo,
    wanted: &'w [usize],
    /// Sorted packet timestamps (`Some`: frames are indexed by timestamp rank).
    pts: Option<&'w [i64]>,
    next: usize,
    seen: usize,
    last_index: Option<usize>,
    scaler: Option<scaling::Context>,
    rgb: VideoFrame,
    kept: Kept,
}

impl Keeper<'_> {
    fn done(&self) -> bool {
        self.next >= self.wanted.len()
    }

    fn is_wanted(&self, index: usize) -> bool {
        self.wanted.binary_search(&index).is_ok()
    }

    fn rank(&self, pts: Option<i64>) -> Option<usize> {
        let sorted = self.pts?;
        sorted.binary_search(&pts?).ok()
    }

    fn take(&mut self, frame: &VideoFrame, limits: &VideoLimits) -> Result<(), PassError> {
        let index = if self.pts.is_some() {
            let index = self.rank(frame.pts()).ok_or(PassError::Inconsistent)?;
            if self.last_index.is_some_and(|last| index <= last) {
                return Err(PassError::Inconsistent);
            }
            index
        } else {
            self.seen
        };
        self.seen += 1;
        self.kept.produced = self.seen;
        self.last_index = Some(index);
        let Some(&want) = self.wanted.get(self.next) else {
            return Ok(());
        };
        if want < index {
            // A kept frame was skipped or never produced.
            if self.pts.is_some() {
                return Err(PassError::Inconsistent);
            }
            return Ok(());
        }
        if want > index {
            return Ok(());
        }
        let image = self.convert(frame, limits)?;
        // Timestamp-indexed frames carry their own (distinct, increasing)
        // timestamps; when counting, the timestamps were found unusable, so
        // the time is the index over the frame rate where that is known.
        let pts = frame.pts().or_else(|| frame.timestamp());
        let t = match pts {
            Some(p) if self.pts.is_some() || self.info.fps <= 0.0 => {
                p.saturating_sub(self.info.start_pts) as f64 * self.info.time_base
            }
            _ if self.info.fps > 0.0 => index as f64 / self.info.fps,
            _ => index as f64,
        };
        self.kept.frames.push(image);
        self.kept.timestamps_s.push(t);
        self.kept.indices.push(index);
        self.next += 1;
        Ok(())
    }

    /// swscale to packed RGB24 at the stream's size, then a row-by-row copy
    /// that drops the stride's padding.
    fn convert(
        &mut self,
        frame: &VideoFrame,
        limits: &VideoLimits,
    ) -> Result<RgbImage, VideoError> {
        let (w, h) = (self.info.width, self.info.height);
        if (frame.width(), frame.height()) != (w, h) {
            check_size(frame.width(), frame.height(), limits)?;
        }
        let stale = self.scaler.as_ref().is_none_or(|s| {
            let input = s.input();
            (input.format, input.width, input.height)
                != (frame.format(), frame.width(), frame.height())
        });
        if stale {
            self.scaler = Some(
                scaling::Context::get(
                    frame.format(),
                    frame.width(),
                    frame.height(),
                    Pixel::RGB24,
                    w,
                    h,
                    scaling::Flags::BICUBIC,
                )
                .map_err(|e| {
                    VideoError::Decode(format!("cannot convert the frames to RGB ({e})"))
                })?,
            );
        }
        let scaler = self
            .scaler
            .as_mut()
            .ok_or_else(|| VideoError::Decode("cannot convert the frames to RGB".to_owned()))?;
        scaler
            .run(frame, &mut self.rgb)
            .map_err(|e| VideoError::Decode(format!("cannot convert the frames to RGB ({e})")))?;
        let row = w as usize * 3;
        let stride = self.rgb.stride(0);
        let data = self.rgb.data(0);
        let mut out = Vec::with_capacity(row * h as usize);
        for y in 0..h as usize {
            let line = data
                .get(y * stride..y * stride + row)
                .ok_or_else(|| VideoError::Decode("the RGB frame is short".to_owned()))?;
            out.extend_from_slice(line);
        }
        RgbImage::from_raw(w, h, out)
            .ok_or_else(|| VideoError::Decode("the RGB frame is short".to_owned()))
    }
}

fn open_decoder(
    input: &MemoryInput<'_>,
    info: &StreamInfo,
    limits: &VideoLimits,
) -> Result<codec::decoder::Video, VideoError> {
    let ctx = input.input()?;
    let stream = ctx
        .stream(info.index)
        .ok_or_else(|| VideoError::Decode("the video stream disappeared".to_owned()))?;
    let mut context = codec::Context::from_parameters(stream.parameters())
        .map_err(|e| VideoError::Decode(format!("cannot set up the decoder ({e})")))?;
    // SAFETY: the codec context is ours and not yet opened; these fields are
    // documented as set by the user before avcodec_open2.
    unsafe {
        let raw = context.as_mut_ptr();
        (*raw).thread_count = i32::try_from(limits.decoder_threads).unwrap_or(0);
        (*raw).thread_type = ffi::FF_THREAD_FRAME | ffi::FF_THREAD_SLICE;
        (*raw).max_pixels = i64::try_from(limits.max_pixels_per_frame).unwrap_or(i64::MAX);
        (*raw).pkt_timebase = (*stream.as_ptr()).time_base;
    }
    context
        .decoder()
        .video()
        .map_err(|e| VideoError::Decode(format!("no decoder for this video ({e})")))
}

/// One decode pass: `pts` set indexes frames by timestamp rank and skips
/// unreferenced frames that are not kept; `None` counts every frame.
fn decode_pass(
    bytes: &[u8],
    info: &StreamInfo,
    wanted: &[usize],
    pts: Option<&[i64]>,
    send: Option<&[bool]>,
    limits: &VideoLimits,
    deadline: Deadline,
) -> Result<Kept, PassError> {
    let mut input = MemoryInput::open(bytes, deadline, limits)?;
    let mut decoder = open_decoder(&input, info, limits)?;
    let mut keeper = Keeper {
        info,
        wanted,
        pts,
        next: 0,
        seen: 0,
        last_index: None,
        scaler: None,
        rgb: VideoFrame::empty(),
        kept: Kept {
            frames: Vec::with_capacity(wanted.len()),
            timestamps_s: Vec::with_capacity(wanted.len()),
            indices: Vec::with_capacity(wanted.len()),
            error: None,
            produced: 0,
        },
    };
    let mut packet = Packet::empty();
    let mut frame = VideoFrame::empty();
    let mut scanned = 0u64;
    let mut decoded = 0u64;
    let mut read_error = None;
    let mut skipping = false;
    let mut position = 0usize;
    while !keeper.done()
        && next_packet(
            &mut input,
            &mut packet,
            &mut scanned,
            limits,
            deadline,
            &mut read_error,
        )?
    {
        if packet.stream() != info.index {
            continue;
        }
        if let Some(send) = send {
            // The same bytes demux to the same packets as in the scan.
            let planned = send.get(position).copied().ok_or(PassError::Inconsistent)?;
            position += 1;
            if !planned {
                continue;
            }
        }
        if pts.is_some() {
            // Skip an unreferenced frame unless it is kept (or unknown).
            let skip = match presented(&packet) {
                Some(p) => keeper.rank(p).is_some_and(|rank| !keeper.is_wanted(rank)),
                None => true,
            };
            if skip != skipping {
                // SAFETY: skip_frame is a plain field the user may change
                // between packets; the frame-threaded decoder copies it when
                // the next packet is submitted.
                unsafe {
                    (*decoder.as_mut_ptr()).skip_frame = if skip {
                        ffi::AVDiscard::AVDISCARD_NONREF
                    } else {
                        ffi::AVDiscard::AVDISCARD_DEFAULT
                    };
                }
                skipping = skip;
            }
        }
        if let Err(e) = decoder.send_packet(&packet) {
            keeper.kept.error = Some(format!("a packet could not be decoded ({e})"));
            continue;
        }
        receive(
            &mut decoder,
            &mut frame,
            &mut keeper,
            &mut decoded,
            limits,
            deadline,
        )?;
    }
    if !keeper.done() {
        // Flush the frames the decoder still holds.
        if decoder.send_eof().is_ok() {
            receive(
                &mut decoder,
                &mut frame,
                &mut keeper,
                &mut decoded,
                limits,
                deadline,
            )?;
        }
    }
    if pts.is_some() && !keeper.done() {
        return Err(PassError::Inconsistent);
    }
    if keeper.kept.error.is_none() {
        keeper.kept.error = read_error;
    }
    Ok(keeper.kept)
}

fn receive(
    decoder: &mut codec::decoder::Video,
    frame: &mut VideoFrame,
    keeper: &mut Keeper<'_>,
    decoded: &mut u64,
    limits: &VideoLimits,
    deadline: Deadline,
) -> Result<(), PassError> {
    while !keeper.done() {
        match decoder.receive_frame(frame) {
            Ok(()) => {
                *decoded += 1;
                if *decoded > limits.max_total_frames_scanned {
                    return Err(PassError::Failed(VideoError::TooLong {
                        frames: *decoded,
                        max: limits.max_total_frames_scanned,
                    }));
                }
                keeper.take(frame, limits)?;
                deadline.check()?;
            }
            Err(ffmpeg_next::Error::Other { errno })
                if errno == ffmpeg_next::util::error::EAGAIN =>
            {
                break
            }
            Err(ffmpeg_next::Error::Eof) => break,
            Err(e) => {
                keeper.kept.error = Some(format!("a frame could not be decoded ({e})"));
                break;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn media(name: &str) -> Vec<u8> {
        let path = format!("{}/tests/media/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(path).unwrap()
    }

    fn scan(bytes: &[u8], limits: &VideoLimits) -> (StreamInfo, Scan) {
        let deadline = Deadline::new(limits.time_budget);
        let mut input = MemoryInput::open(bytes, deadline, limits).unwrap();
        let info = stream_info(&input).unwrap();
        let scan = scan_packets(&mut input, &info, limits, deadline).unwrap();
        (info, scan)
    }

    fn pass(
        bytes: &[u8],
        info: &StreamInfo,
        wanted: &[usize],
        pts: Option<&[i64]>,
        send: Option<&[bool]>,
    ) -> Kept {
        let limits = VideoLimits::default();
        match decode_pass(
            bytes,
            info,
            wanted,
            pts,
            send,
            &limits,
            Deadline::new(limits.time_budget),
        ) {
            Ok(kept) => kept,
            Err(PassError::Inconsistent) => panic!("inconsistent timestamps"),
            Err(PassError::Failed(e)) => panic!("{e}"),
        }
    }

    /// The timestamp-indexed pass (which skips unreferenced frames, and with
    /// the send plan whole runs between cuts) keeps the same frames as
    /// counting every decoded frame, and does skip: B-frames in H.264 and
    /// MPEG-4 part 2, GOP tails in H.264 (IDR every 12), VP8 and VP9 (key
    /// frame every 10).
    #[test]
    fn skipping_pass_equals_counting_pass() {
        for name in [
            "testsrc_h264.mp4",
            "testsrc_mpeg4.mp4",
            "testsrc_vp8.webm",
            "testsrc_vp9.webm",
            "testsrc_hevc.mp4",
            "testsrc_h264.ts",
        ] {
            let bytes = media(name);
            let (info, scan) = scan(&bytes, &VideoLimits::default());
            let pts = scan.sorted_pts.as_deref().expect("timestamps");
            assert_eq!(pts.len(), scan.frames);
            let cuts = scan.packets.iter().filter(|p| p.cut).count();
            // IDR / key frames every 12 (the 2 s H.264 mp4) or 10 frames; none
            // count for MPEG-4 part 2.
            let expect_cuts = match name {
                "testsrc_h264.mp4" => 5,
                "testsrc_mpeg4.mp4" => 0,
                _ => 3,
            };
            assert_eq!(cuts, expect_cuts, "{name}");
            for n in [1, 2, 3, 6, 50] {
                let opts = VideoIoOptions {
                    num_frames: n,
                    ..VideoIoOptions::default()
                };
                let wanted = sample_indices(scan.frames, info.fps, &opts);
                let plan = send_plan(&scan.packets, pts, &wanted);
                let planned = pass(&bytes, &info, &wanted, Some(pts), Some(&plan));
                let fast = pass(&bytes, &info, &wanted, Some(pts), None);
                let slow = pass(&bytes, &info, &wanted, None, None);
                assert_eq!(slow.indices, wanted, "{name} n={n}");
                for other in [&fast, &planned] {
                    assert_eq!(other.indices, wanted, "{name} n={n}");
                    assert!(other.frames == slow.frames, "{name} n={n}: frames differ");
                    for (a, b) in other.timestamps_s.iter().zip(&slow.timestamps_s) {
                        assert!((a - b).abs() < 1e-6, "{name} n={n}: {a} vs {b}");
                    }
                }
                let last = wanted.last().copied().unwrap_or(0);
                assert_eq!(slow.produced, last + 1, "{name} n={n}");
                let has_b_frames = !name.ends_with(".webm");
                if n == 3 && has_b_frames {
                    assert!(fast.produced < slow.produced, "{name}: no B-frame skipped");
                }
                if n == 3 && cuts > 0 {
                    assert!(
                        plan.iter().any(|send| !send),
                        "{name}: the plan sends everything"
                    );
                    assert!(planned.produced < fast.produced, "{name}: no run skipped");
                }
            }
        }
    }

    #[test]
    fn send_plan_keeps_runs_up_to_the_last_kept_frame() {
        let packet = |pts: i64, cut: bool| ScannedPacket {
            pts: Some(pts),
            cut,
        };
        // Decode order I0 P3 B1 B2 | I4 P5 | I6 P7 (pts = presentation rank).
        let packets = [
            packet(0, true),
            packet(3, false),
            packet(1, false),
            packet(2, false),
            packet(4, true),
            packet(5, false),
            packet(6, true),
            packet(7, false),
        ];
        let pts: Vec<i64> = (0..8).collect();
        // Frame 2 needs I0 P3 B1 B2; nothing is kept in [4, 5]; frame 6 needs I6 only.
        assert_eq!(
            send_plan(&packets, &pts, &[2, 6]),
            vec![true, true, true, true, false, false, true, false]
        );
        assert_eq!(
            send_plan(&packets, &pts, &[7]),
            vec![false, false, false, false, false, false, true, true]
        );
        assert!(send_plan(&packets, &pts, &[]).iter().all(|s| !s));
    }

    #[test]
    fn nal_headers() {
        // Two length-prefixed NALs (4-byte lengths): an SPS (0x67) and an IDR slice (0x65).
        let avcc = [0, 0, 0, 2, 0x67, 0xaa, 0, 0, 0, 1, 0x65];
        assert_eq!(
            nal_types(&avcc, Some(4)).collect::<Vec<_>>(),
            vec![0x67, 0x65]
        );
        // A length running past the end stops the walk.
        assert_eq!(
            nal_types(&[0, 0, 0, 9, 0x41], Some(4)).collect::<Vec<_>>(),
            vec![0x41]
        );
        assert_eq!(nal_types(&[0, 0, 0xff], Some(4)).count(), 0);
        let annex_b = [0, 0, 0, 1, 0x67, 0x42, 0, 0, 1, 0x65, 0x88];
        assert_eq!(
            nal_types(&annex_b, None).collect::<Vec<_>>(),
            vec![0x67, 0x65]
        );
    }

    /// A frame whose timestamp matches no packet makes the pass inconsistent
    /// (and `decode` falls back to counting).
    #[test]
    fn unknown_timestamps_are_inconsistent() {
        let bytes = media("testsrc_h264.mp4");
        let limits = VideoLimits::default();
        let (info, scan) = scan(&bytes, &limits);
        let shifted: Vec<i64> = scan.sorted_pts.unwrap().iter().map(|p| p + 1).collect();
        let result = decode_pass(
            &bytes,
            &info,
            &[0, 10],
            Some(&shifted),
            None,
            &limits,
            Deadline::new(limits.time_budget),
        );
        assert!(matches!(result, Err(PassError::Inconsistent)));
    }
}
