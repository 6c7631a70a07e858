//! One request's media, from content parts to model-ready tensors.
//!
//! [`MediaPipeline::process`] is what the gateway calls after the policy layers have passed a
//! request (CONTRACT section 2, step 5). For the request's media items, in order:
//!
//! 1. every part with a `uuid` and no data is looked up in the uuid cache first, so a cache miss
//!    is the contract's 400 before anything is fetched;
//! 2. the other parts are fetched concurrently ([`MediaFetcher`]: URL policy, SSRF refusal, size
//!    caps, per-modality timeouts);
//! 3. each item's cost is read from its header ([`estimate`]): its placeholder tokens, which
//!    must fit in the request's [`TokenBudget`] (a 400 naming the item), and its decoded bytes,
//!    reserved against the server's decoded-media budget (a 503 when it is taken);
//! 4. each is decoded and processed on the bounded [`DecodePool`] (never on the reactor) with the
//!    request's typed [`MediaOptions`] (from the merged `media_io_kwargs`: how to load; from
//!    `mm_processor_kwargs`: how the model's processor sizes it); untrusted video gets the
//!    tighter time budget and thread cap;
//! 5. results carrying a `uuid` are cached under it.
//!
//! Each result has a content hash over the media's bytes and the options that shaped its tensor
//! (prefix-cache `("mm", hash, offset)` keys and uuid caching) and the number of placeholder
//! tokens the prompt needs for it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use policies::{MediaOptions, MediaUrlPolicy};

use crate::audio::{self, AudioIoOptions, DEFAULT_MAX_DURATION_S};
use crate::budget::{ByteBudget, Reservation};
use crate::cache::{UuidCache, Weigh};
use crate::error::PreprocessError;
use crate::estimate::{self, Estimate};
use crate::fetch::{FetchLimits, MediaFetcher, Payload};
use crate::image::{self, ImageIoOptions, ImageProcessor, PatchProcessor, ProcessImage};
use crate::pool::{DecodePool, PoolConfig};
use crate::video::{self, VideoIoOptions, VideoLimits};
use crate::{ContentHash, Modality};

/// One media item of a request, as the message parser found it.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaRequestItem {
    pub modality: Modality,
    /// `data:`, `http(s):` or `file:`; `None` for a uuid-only reference.
    pub url: Option<String>,
    pub uuid: Option<String>,
}

pub use crate::budget::TokenBudget;
pub use media::spec::ModelMediaSpec;
pub use media::{MediaTensor, ProcessedMedia};

impl Weigh for ProcessedMedia {
    fn weight_bytes(&self) -> usize {
        self.tensor.weight_bytes() + std::mem::size_of::<ProcessedMedia>()
    }
}

/// Sizes of the pipeline (start-up settings).
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    pub fetch: FetchLimits,
    pub pool: PoolConfig,
    /// Bytes of processed media the uuid cache keeps (0 disables it).
    pub uuid_cache_bytes: usize,
    /// Limits for video from trusted clients (and everyone under `--trust-request-mm-kwargs`).
    pub video: VideoLimits,
    /// Limits for video whose options the client could not choose: a tighter time budget.
    pub untrusted_video: VideoLimits,
    /// Pixel cap for images (and each JPEG frame), checked from the header.
    pub max_image_pixels: u64,
    /// Decoded audio duration cap, seconds.
    pub max_audio_duration_s: f64,
    /// Bytes of decoded media (and their tensors) all requests may hold at once, as the items'
    /// headers declare them; past it new items get a 503.
    pub max_decoded_bytes: usize,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        let video = VideoLimits::default();
        let untrusted_video = VideoLimits {
            time_budget: Duration::from_secs(10),
            decoder_threads: video.decoder_threads.min(2),
            ..video.clone()
        };
        PipelineConfig {
            fetch: FetchLimits::default(),
            pool: PoolConfig::default(),
            uuid_cache_bytes: 512 << 20,
            video,
            untrusted_video,
            max_image_pixels: image::DEFAULT_MAX_PIXELS,
            max_audio_duration_s: 600.0,
            max_decoded_bytes: 2 << 30,
        }
    }
}

/// A request's processed media, in its items' order, with their hold on the decoded-media
/// budget.
#[derive(Debug)]
pub struct Processed {
    pub media: Vec<Arc<ProcessedMedia>>,
    pub decoded: DecodedHold,
}

impl std::ops::Deref for Processed {
    type Target = [Arc<ProcessedMedia>];
    fn deref(&self) -> &Self::Target {
        &self.media
    }
}

/// Decoded items' hold on the decoded-media budget, released when dropped.
#[derive(Debug)]
pub struct DecodedHold(Vec<Reservation>);

impl DecodedHold {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.0.iter().map(Reservation::bytes).sum()
    }
}

/// The media pipeline a server holds for its lifetime.
pub struct MediaPipeline {
    fetcher: MediaFetcher,
    pool: DecodePool,
    cache: UuidCache<ProcessedMedia>,
    bytes: ByteBudget,
    config: PipelineConfig,
}

impl std::fmt::Debug for MediaPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MediaPipeline")
            .field("config", &self.config)
            .field("cached", &self.cache.len())
            .finish()
    }
}

/// What a job needs to turn fetched bytes into a tensor (owned: it moves to the pool).
struct Job {
    modality: Modality,
    payload: Payload,
    /// The payload's hold on the fetched-media budget: released with it, once decoded.
    _held: Reservation,
    mime: Option<String>,
    options: MediaOptions,
    spec: ModelMediaSpec,
    max_image_pixels: u64,
    max_audio_duration_s: f64,
    video_limits: VideoLimits,
}

impl MediaPipeline {
    /// Builds the fetcher (its HTTP client), the decode pool and the cache at start-up.
    pub fn new(policy: MediaUrlPolicy, config: PipelineConfig) -> Result<Self, reqwest::Error> {
        Ok(MediaPipeline {
            fetcher: MediaFetcher::new(policy, config.fetch.clone())?,
            pool: DecodePool::new(config.pool),
            cache: UuidCache::new(config.uuid_cache_bytes),
            bytes: ByteBudget::new(config.max_decoded_bytes),
            config,
        })
    }

    pub fn fetcher(&self) -> &MediaFetcher {
        &self.fetcher
    }

    pub fn pool(&self) -> &DecodePool {
        &self.pool
    }

    /// The sizes it was built with.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// The decoded-media bytes budget (for metrics and tests).
    pub fn decoded_bytes(&self) -> &ByteBudget {
        &self.bytes
    }

    /// Entries in the uuid cache.
    pub fn cached_items(&self) -> usize {
        self.cache.len()
    }

    /// Fetches, decodes and processes a request's media (see the module docs). `trusted` is
    /// the gate's decision: untrusted video runs under the tighter limits. `budget` is the
    /// prompt tokens left for the media: the items' tokens, read from their headers, must fit
    /// in it before anything is decoded.
    /// The decoded items' hold on the decoded-media budget comes with them: their tensors stay
    /// counted until the caller has accounted for them elsewhere (a request's own memory
    /// account) and drops it.
    pub async fn process(
        &self,
        items: &[MediaRequestItem],
        options: &MediaOptions,
        trusted: bool,
        spec: &ModelMediaSpec,
        budget: TokenBudget,
    ) -> Result<Processed, PreprocessError> {
        // (1) uuid-only parts: hits or the contract's miss, before any fetch.
        let mut out: Vec<Option<Arc<ProcessedMedia>>> = vec![None; items.len()];
        let mut indices = Vec::with_capacity(items.len());
        let mut per_modality = std::collections::HashMap::<Modality, usize>::new();
        for (slot, item) in out.iter_mut().zip(items) {
            let index = per_modality.entry(item.modality).or_default();
            indices.push(*index);
            if item.url.is_none() {
                let uuid = item.uuid.as_deref().unwrap_or_default();
                *slot = Some(self.cache.get(item.modality, uuid, *index)?);
            }
            *index += 1;
        }
        // (2) fetch the rest concurrently.
        let wanted: Vec<(usize, &str)> = items
            .iter()
            .enumerate()
            .filter(|(i, _)| out[*i].is_none())
            .filter_map(|(i, item)| item.url.as_deref().map(|url| (i, url)))
            .collect();
        let fetched = futures::future::try_join_all(
            wanted
                .iter()
                .map(|&(i, url)| self.fetcher.fetch(url, items[i].modality, &self.pool)),
        )
        .await?;
        let jobs: Vec<Job> = wanted
            .iter()
            .zip(fetched)
            .map(|(&(i, _), fetched)| Job {
                modality: items[i].modality,
                payload: fetched.payload,
                mime: fetched.mime,
                _held: fetched.held,
                options: options.clone(),
                spec: spec.clone(),
                max_image_pixels: self.config.max_image_pixels,
                max_audio_duration_s: self.config.max_audio_duration_s,
                video_limits: if trusted {
                    self.config.video.clone()
                } else {
                    self.config.untrusted_video.clone()
                },
            })
            .collect();
        // (3) the cost of each from its header, checked against both budgets before decoding.
        let (jobs, estimates) = self
            .pool
            .run(move || {
                let estimates: Vec<Option<Estimate>> = jobs.iter().map(estimate_job).collect();
                (jobs, estimates)
            })
            .await?;
        let described: Vec<(String, Option<&Estimate>)> = wanted
            .iter()
            .zip(&estimates)
            .map(|(&(i, _), e)| {
                let what = format!("{} at index {}", items[i].modality, indices[i]);
                (what, e.as_ref())
            })
            .collect();
        let cached_tokens: usize = out
            .iter()
            .flatten()
            .filter_map(|p| cached_tokens(p, spec))
            .sum();
        check_tokens(&described, cached_tokens, budget)?;
        let reservations = described
            .iter()
            .zip(&jobs)
            .map(|((what, e), job)| {
                let bytes = e.map_or(job.payload.len(), |e| e.decoded_bytes);
                self.reserve(what, e, bytes)
            })
            .collect::<Result<Vec<_>, _>>()?;
        // (4) decode concurrently; the pool bounds the work, each reservation is kept with
        // its tensor (and ends with the job when decoding fails).
        let work = jobs
            .into_iter()
            .zip(reservations)
            .map(|(job, reservation)| async move {
                let processed = self.pool.run(move || run_job(job)).await??;
                Ok::<_, PreprocessError>((Arc::new(processed), reservation))
            });
        let (done, held): (Vec<_>, Vec<_>) = futures::future::try_join_all(work)
            .await?
            .into_iter()
            .unzip();
        for (&(i, _), processed) in wanted.iter().zip(done) {
            // (5) a part with data and a uuid is cached under its uuid.
            if let Some(uuid) = items[i].uuid.as_deref() {
                self.cache.put(items[i].modality, uuid, processed.clone());
            }
            out[i] = Some(processed);
        }
        let media = out
            .into_iter()
            .map(|p| p.ok_or(PreprocessError::DecoderFailed))
            .collect::<Result<_, _>>()?;
        Ok(Processed {
            media,
            decoded: DecodedHold(held),
        })
    }

    /// Holds `bytes` of the decoded-media budget for one item.
    fn reserve(
        &self,
        what: &str,
        estimate: &Option<&Estimate>,
        bytes: usize,
    ) -> Result<Reservation, PreprocessError> {
        self.bytes.try_reserve(bytes).map_err(|refused| {
            if refused.needed > refused.capacity {
                PreprocessError::MediaTooLarge {
                    item: what.to_owned(),
                    size: estimate.map_or_else(|| "unknown size".to_owned(), |e| e.size.clone()),
                    needed: refused.needed,
                    capacity: refused.capacity,
                }
            } else {
                refused.media_busy("decoding")
            }
        })
    }
}

/// The items' tokens (those the headers tell, plus the cached items') against the budget; the
/// error names the largest item.
fn check_tokens(
    items: &[(String, Option<&Estimate>)],
    cached: usize,
    budget: TokenBudget,
) -> Result<(), PreprocessError> {
    let tokens = |e: &Option<&Estimate>| e.and_then(|e| e.tokens).unwrap_or(0);
    let total = items
        .iter()
        .map(|(_, e)| tokens(e))
        .fold(cached, usize::saturating_add);
    if total <= budget.available {
        return Ok(());
    }
    let Some((what, Some(largest))) = items.iter().max_by_key(|(_, e)| tokens(e)) else {
        return Ok(());
    };
    Err(PreprocessError::OverTokenBudget {
        item: what.clone(),
        size: largest.size.clone(),
        tokens: largest.tokens.unwrap_or(0),
        total,
        available: budget.available,
    })
}

/// Placeholder tokens of an item already processed (a uuid cache hit).
fn cached_tokens(processed: &ProcessedMedia, spec: &ModelMediaSpec) -> Option<usize> {
    match &processed.tensor {
        MediaTensor::Image(p) => {
            let Some(ImageProcessor::Qwen2Vl(q)) = &spec.image else {
                return None;
            };
            Some(media::tokens::vision(p.grid_thw?, q.merge_size))
        }
        MediaTensor::Video { frames, .. } => Some(media::tokens::vision(
            frames.grid_thw?,
            spec.video.as_ref()?.merge_size,
        )),
        MediaTensor::Audio(a) => Some(media::tokens::audio(a.valid_frames)),
    }
}

/// An item's cost from its header (runs on the decode pool: a video's header needs FFmpeg).
fn estimate_job(job: &Job) -> Option<Estimate> {
    match (job.modality, &job.payload) {
        (Modality::Image, Payload::Bytes(bytes)) => estimate::image(
            bytes,
            job.spec.image.as_ref()?,
            job.options.processor().ok()?,
            job.max_image_pixels,
        ),
        (Modality::Audio, Payload::Bytes(bytes)) => {
            estimate::audio(bytes, job.mime.as_deref(), job.spec.audio.as_ref()?)
        }
        (Modality::Video, payload) => {
            let q = job.spec.video.as_ref()?;
            let mm = job.options.processor().ok()?;
            let opts = VideoIoOptions::new(job.options.video().ok()?);
            match payload {
                Payload::Bytes(bytes) => {
                    estimate::container(bytes, q, mm, &opts, &job.video_limits)
                }
                Payload::JpegFrames(frames) => estimate::jpeg_frames(frames, q, mm, &opts),
            }
        }
        _ => None,
    }
}

/// The bytes that identify a payload, in order.
fn payload_parts(payload: &Payload) -> Vec<&[u8]> {
    match payload {
        Payload::Bytes(b) => vec![b.as_ref()],
        Payload::JpegFrames(frames) => frames.iter().map(Bytes::as_ref).collect(),
    }
}

/// Hash of the media's bytes plus the options that shaped its tensor: the processor's and
/// those of its modality's loader.
fn content_hash(job: &Job) -> ContentHash {
    let o = &job.options;
    let load = match job.modality {
        Modality::Image => format!("{:?}", o.image()),
        Modality::Video => format!("{:?}", o.video()),
        Modality::Audio => format!("{:?}", o.audio()),
    };
    let options = format!("{}|{load}|{:?}", job.modality, o.processor());
    let mut parts = vec![options.as_bytes()];
    parts.extend(payload_parts(&job.payload));
    ContentHash::of_parts(parts)
}

/// Decode and process one item (runs on the decode pool).
fn run_job(job: Job) -> Result<ProcessedMedia, PreprocessError> {
    let hash = content_hash(&job);
    let not_accepted = || PreprocessError::NotAccepted {
        modality: job.modality,
    };
    let tensor = match job.modality {
        Modality::Image => {
            let processor = job.spec.image.as_ref().ok_or_else(not_accepted)?;
            let io = ImageIoOptions::new(job.options.image()?, job.max_image_pixels);
            let Payload::Bytes(bytes) = &job.payload else {
                return Err(PreprocessError::WrongPayload {
                    modality: job.modality,
                });
            };
            let rgb = image::decode_image(bytes, &io)?.into_rgb();
            let processed = match processor {
                ImageProcessor::Qwen2Vl(q) => q
                    .clone()
                    .with_options(job.options.processor()?)?
                    .process(&rgb)?,
                other => other.process(&rgb)?,
            };
            MediaTensor::Image(processed)
        }
        Modality::Video => {
            let processor = job.spec.video.as_ref().ok_or_else(not_accepted)?;
            let opts = VideoIoOptions::new(job.options.video()?);
            let decoded = match &job.payload {
                Payload::Bytes(bytes) => video::decode_video(bytes, &opts, &job.video_limits)?,
                Payload::JpegFrames(frames) => {
                    video::decode_jpeg_frames(frames, &opts, &job.video_limits)?
                }
            };
            let frames = processor
                .clone()
                .with_options(job.options.processor()?)?
                .process_frames(&decoded.frames)?;
            MediaTensor::Video {
                frames,
                timestamps_s: decoded.timestamps_s,
            }
        }
        Modality::Audio => {
            let cfg = job.spec.audio.as_ref().ok_or_else(not_accepted)?;
            let io = AudioIoOptions::new(
                job.options.audio()?,
                DEFAULT_MAX_DURATION_S.min(job.max_audio_duration_s),
            );
            let Payload::Bytes(bytes) = &job.payload else {
                return Err(PreprocessError::WrongPayload {
                    modality: job.modality,
                });
            };
            MediaTensor::Audio(audio::audio_to_features(
                bytes,
                job.mime.as_deref(),
                &io,
                cfg,
            )?)
        }
    };
    Ok(ProcessedMedia { hash, tensor })
}
