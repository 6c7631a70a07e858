//! The media connector: a content part's URL in, the media's bytes out.
//!
//! * `data:` URLs: the length bound is checked ([`MediaUrlPolicy::check_url`])
//!   before a byte is decoded; the base64 is decoded on the decode pool, not on
//!   the reactor. `data:video/jpeg;base64,<f1>,<f2>,...` gives one payload per
//!   frame.
//! * `http(s)`: an async client (rustls) with no proxy from the environment and
//!   no automatic redirects. Host names are resolved by [`CheckedResolver`],
//!   which refuses non-public addresses (unless exempt) and hands the client
//!   only the addresses it checked, so the connection goes to a checked
//!   address (no DNS rebinding between check and connect). Redirects are
//!   followed by hand, each target checked again, at most
//!   [`policies::MAX_REDIRECTS`]. `Content-Length` over the cap is refused
//!   before the body is read; the streamed bytes are capped too. The whole
//!   fetch (connect, headers, body) runs under the modality's timeout, so a
//!   server that trickles bytes is cut off.
//! * `file:`: only under `--allowed-local-media-path` (canonicalised, symlinks
//!   resolved), size checked from the metadata before reading.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use policies::{MediaUrl, MediaUrlPolicy, PolicyError};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::Url;

use crate::budget::{ByteBudget, Reservation};
use crate::error::{ErrorKind, PreprocessError};
use crate::pool::DecodePool;
use crate::Modality;

/// Per-modality fetch limits (CONTRACT section 4 defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct FetchLimits {
    /// Download size cap for images and video (bytes), enforced while streaming.
    pub max_bytes: usize,
    /// Audio file size cap (bytes).
    pub max_audio_bytes: usize,
    pub image_timeout: Duration,
    pub audio_timeout: Duration,
    pub video_timeout: Duration,
    /// Bytes of fetched media (`http(s)` and `file:` URLs) all requests may hold at once,
    /// from the first byte read until the item is decoded; past it new fetches get a 503.
    /// Never less than one item's cap. Data URLs are held in their request's body instead.
    pub max_fetched_bytes: usize,
}

impl Default for FetchLimits {
    fn default() -> Self {
        FetchLimits {
            max_bytes: policies::DEFAULT_MAX_MEDIA_BYTES,
            max_audio_bytes: 25 * 1024 * 1024,
            image_timeout: Duration::from_secs(5),
            audio_timeout: Duration::from_secs(10),
            video_timeout: Duration::from_secs(30),
            max_fetched_bytes: 1 << 30,
        }
    }
}

impl FetchLimits {
    /// The byte cap for one item of `modality`.
    pub fn max_bytes_for(&self, modality: Modality) -> usize {
        match modality {
            Modality::Audio => self.max_audio_bytes.min(self.max_bytes),
            Modality::Image | Modality::Video => self.max_bytes,
        }
    }

    /// The fetched-media budget as applied: never less than one item's cap.
    pub fn fetched_budget(&self) -> usize {
        self.max_fetched_bytes
            .max(self.max_bytes)
            .max(self.max_audio_bytes)
    }

    /// The fetch timeout for `modality`.
    pub fn timeout_for(&self, modality: Modality) -> Duration {
        match modality {
            Modality::Image => self.image_timeout,
            Modality::Audio => self.audio_timeout,
            Modality::Video => self.video_timeout,
        }
    }
}

/// Fetch failures: a 422 (`UnprocessableEntityError`) unless noted.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("Failed to fetch media from {url}: the server answered {status}.")]
    UpstreamStatus { url: String, status: u16 },
    #[error("Failed to fetch media from {url}: {reason}.")]
    Connect { url: String, reason: String },
    #[error("Failed to fetch media from {url}: the {modality} is {len} bytes, over the limit of {max} bytes.")]
    TooLarge {
        url: String,
        modality: Modality,
        len: u64,
        max: usize,
    },
    #[error("Failed to fetch media from {url}: no answer within {seconds} s (the {modality} fetch timeout).")]
    Timeout {
        url: String,
        modality: Modality,
        seconds: f64,
    },
    #[error("Failed to fetch media from {url}: a redirect without a valid Location header.")]
    BadRedirect { url: String },
    /// 400: the data URL's payload is not valid base64.
    #[error("Invalid data URL: the payload is not valid base64 ({reason}).")]
    InvalidBase64 { reason: String },
    /// 400: the `file:` URL could not be read.
    #[error("Cannot read the local media file '{path}': {reason}.")]
    LocalFile { path: String, reason: String },
}

impl FetchError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            FetchError::InvalidBase64 { .. } | FetchError::LocalFile { .. } => {
                ErrorKind::BadRequest
            }
            _ => ErrorKind::Unprocessable,
        }
    }
}

/// Fetched media: the bytes, and the media type where the source says one.
#[derive(Debug)]
pub struct FetchedMedia {
    /// One payload, or one per frame for `data:video/jpeg;base64,<f1>,<f2>,...`.
    pub payload: Payload,
    /// `image/png`, from the data URL header or the `Content-Type`; a hint only
    /// (decoders sniff the bytes).
    pub mime: Option<String>,
    /// The payload's bytes held against the fetched-media budget, until dropped (with the
    /// payload, once it is decoded).
    pub held: Reservation,
}

#[derive(Debug, Clone)]
pub enum Payload {
    Bytes(Bytes),
    JpegFrames(Vec<Bytes>),
}

impl Payload {
    /// Total bytes.
    pub fn len(&self) -> usize {
        match self {
            Payload::Bytes(b) => b.len(),
            Payload::JpegFrames(frames) => frames.iter().map(Bytes::len).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The resolver the HTTP client uses: every address a media host resolves to
/// is checked by the URL policy; refused addresses are dropped, and when none
/// is left the lookup fails with the policy's reason ([`ResolveRefused`]).
#[derive(Debug, Clone)]
pub struct CheckedResolver {
    policy: Arc<MediaUrlPolicy>,
}

/// The error a refused lookup carries through the HTTP client.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ResolveRefused(pub PolicyError);

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let mut allowed = Vec::with_capacity(addrs.len());
            for addr in addrs {
                match policy.check_resolved_ip(addr.ip(), &host) {
                    Ok(()) => allowed.push(addr),
                    Err(e) => {
                        refused.get_or_insert(e);
                    }
                }
            }
            if allowed.is_empty() {
                if let Some(e) = refused {
                    return Err(
                        Box::new(ResolveRefused(e)) as Box<dyn std::error::Error + Send + Sync>
                    );
                }
            }
            let addrs: Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

/// Fetches media under the URL policy and the fetch limits.
#[derive(Debug, Clone)]
pub struct MediaFetcher {
    policy: Arc<MediaUrlPolicy>,
    limits: FetchLimits,
    client: reqwest::Client,
    fetched: ByteBudget,
}

impl MediaFetcher {
    /// Builds the fetcher (and its HTTP client) at start-up.
    pub fn new(policy: MediaUrlPolicy, limits: FetchLimits) -> Result<Self, reqwest::Error> {
        let policy = Arc::new(policy);
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(CheckedResolver {
                policy: policy.clone(),
            }))
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!("gateway-media/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let capacity = limits.fetched_budget();
        Ok(MediaFetcher {
            policy,
            limits,
            client,
            fetched: ByteBudget::new(capacity),
        })
    }

    pub fn policy(&self) -> &MediaUrlPolicy {
        &self.policy
    }

    pub fn limits(&self) -> &FetchLimits {
        &self.limits
    }

    /// The fetched-media budget (for the memory bound, metrics and tests).
    pub fn fetched_bytes(&self) -> &ByteBudget {
        &self.fetched
    }

    /// Grows `held` to `total` bytes of the fetched-media budget, or says the server is busy.
    fn hold(&self, held: &mut Reservation, total: usize) -> Result<(), PreprocessError> {
        let more = total.saturating_sub(held.bytes());
        held.try_grow(more)
            .map_err(|refused| refused.media_busy("downloading"))
    }

    /// Fetches one media URL for `modality`. Base64 decoding of data URLs runs
    /// on `pool`.
    pub async fn fetch(
        &self,
        url: &str,
        modality: Modality,
        pool: &DecodePool,
    ) -> Result<FetchedMedia, PreprocessError> {
        let max = self.limits.max_bytes_for(modality);
        match self.policy.check_url(url)? {
            MediaUrl::Data(data) => {
                let mime = (!data.mime.is_empty()).then(|| data.mime.clone());
                if data.decoded_len_upper_bound() > max.saturating_add(3) {
                    return Err(FetchError::TooLarge {
                        url: "a data URL".to_owned(),
                        modality,
                        len: data.decoded_len_upper_bound() as u64,
                        max,
                    }
                    .into());
                }
                let frames = data.is_jpeg_frame_list();
                let payload = data.payload.to_owned();
                let payload = pool
                    .run(move || decode_data_payload(&payload, frames))
                    .await??;
                Ok(FetchedMedia {
                    payload,
                    mime,
                    held: self.fetched.empty(),
                })
            }
            MediaUrl::File(path) => {
                let shown = path.display().to_string();
                let local = |e: std::io::Error| FetchError::LocalFile {
                    path: shown.clone(),
                    reason: e.to_string(),
                };
                let meta = tokio::fs::metadata(&path).await.map_err(local)?;
                if meta.len() > max as u64 {
                    return Err(FetchError::TooLarge {
                        url: shown,
                        modality,
                        len: meta.len(),
                        max,
                    }
                    .into());
                }
                // The file may grow between the two calls: the read is held to the cap.
                let mut held = self.fetched.empty();
                self.hold(&mut held, meta.len() as usize)?;
                let bytes = read_capped(&path, meta.len(), max).await.map_err(local)?;
                if bytes.len() > max {
                    return Err(FetchError::TooLarge {
                        url: shown,
                        modality,
                        len: bytes.len() as u64,
                        max,
                    }
                    .into());
                }
                self.hold(&mut held, bytes.len())?;
                Ok(FetchedMedia {
                    payload: Payload::Bytes(Bytes::from(bytes)),
                    mime: None,
                    held,
                })
            }
            MediaUrl::Http(parsed) => {
                let timeout = self.limits.timeout_for(modality);
                let shown = redact(&parsed);
                match tokio::time::timeout(timeout, self.fetch_http(parsed, modality, max)).await {
                    Ok(result) => result,
                    Err(_) => Err(FetchError::Timeout {
                        url: shown,
                        modality,
                        seconds: timeout.as_secs_f64(),
                    }
                    .into()),
                }
            }
        }
    }

    async fn fetch_http(
        &self,
        mut url: Url,
        modality: Modality,
        max: usize,
    ) -> Result<FetchedMedia, PreprocessError> {
        let mut redirects = 0usize;
        loop {
            let shown = redact(&url);
            let response = self
                .client
                .get(url.clone())
                .send()
                .await
                .map_err(|e| request_error(&shown, e))?;
            let status = response.status();
            if status.is_redirection() {
                let target = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|loc| url.join(loc).ok())
                    .ok_or_else(|| FetchError::BadRedirect { url: shown.clone() })?;
                self.policy.check_redirect(&target, redirects)?;
                redirects += 1;
                url = target;
                continue;
            }
            if !status.is_success() {
                return Err(FetchError::UpstreamStatus {
                    url: shown,
                    status: status.as_u16(),
                }
                .into());
            }
            if let Some(len) = response.content_length() {
                if len > max as u64 {
                    return Err(FetchError::TooLarge {
                        url: shown,
                        modality,
                        len,
                        max,
                    }
                    .into());
                }
            }
            let mime = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.split(';').next().unwrap_or(v).trim().to_ascii_lowercase());
            let initial = response.content_length().unwrap_or(0).min(max as u64) as usize;
            // What the buffer allocates is held before it is allocated.
            let mut held = self.fetched.empty();
            self.hold(&mut held, initial)?;
            let mut body = BytesMut::with_capacity(initial);
            let mut stream = response.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| request_error(&shown, e))?;
                let len = body.len() + chunk.len();
                if len > max {
                    return Err(FetchError::TooLarge {
                        url: shown,
                        modality,
                        len: len as u64,
                        max,
                    }
                    .into());
                }
                if len > body.capacity() {
                    // Grown as `Vec` grows (doubling), but never past the cap.
                    let grown = len.max(body.capacity().saturating_mul(2)).min(max);
                    self.hold(&mut held, grown)?;
                    body.reserve(grown - body.len());
                }
                body.extend_from_slice(&chunk);
            }
            return Ok(FetchedMedia {
                payload: Payload::Bytes(body.freeze()),
                mime,
                held,
            });
        }
    }
}

/// A local file's bytes, at most `max` of them (one more is read, to tell a file that grew
/// past the cap), into a buffer of the size its metadata gave.
async fn read_capped(path: &std::path::Path, len: u64, max: usize) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let file = tokio::fs::File::open(path).await?;
    let mut bytes = Vec::with_capacity(len as usize + 1);
    file.take(max as u64 + 1).read_to_end(&mut bytes).await?;
    Ok(bytes)
}

/// Decodes a data URL payload (one base64 blob, or comma-separated JPEG frames).
fn decode_data_payload(payload: &str, frames: bool) -> Result<Payload, FetchError> {
    let decode = |text: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map(Bytes::from)
            .map_err(|e| FetchError::InvalidBase64 {
                reason: e.to_string(),
            })
    };
    if frames {
        payload
            .split(',')
            .map(decode)
            .collect::<Result<Vec<_>, _>>()
            .map(Payload::JpegFrames)
    } else {
        decode(payload).map(Payload::Bytes)
    }
}

/// The URL as shown in messages: without user info or query (which may carry
/// credentials).
fn redact(url: &Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

/// Maps a client error: a refused lookup becomes the policy's 400, anything
/// else a 422 naming the URL.
fn request_error(shown: &str, e: reqwest::Error) -> PreprocessError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = source {
        if let Some(refused) = err.downcast_ref::<ResolveRefused>() {
            return PreprocessError::Policy(refused.0.clone());
        }
        source = err.source();
    }
    let reason = if e.is_connect() {
        "cannot connect".to_owned()
    } else if e.is_timeout() {
        "the connection timed out".to_owned()
    } else {
        let mut text = e.to_string();
        let mut s = std::error::Error::source(&e);
        while let Some(inner) = s {
            text.push_str(": ");
            text.push_str(&inner.to_string());
            s = inner.source();
        }
        text
    };
    FetchError::Connect {
        url: shown.to_owned(),
        reason,
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_payload_decodes_and_refuses_garbage() {
        match decode_data_payload("aGVsbG8=", false) {
            Ok(Payload::Bytes(b)) => assert_eq!(&b[..], b"hello"),
            other => panic!("{other:?}"),
        }
        match decode_data_payload("aGVsbG8=,d29ybGQ=", true) {
            Ok(Payload::JpegFrames(f)) => {
                assert_eq!(f.len(), 2);
                assert_eq!(&f[1][..], b"world");
            }
            other => panic!("{other:?}"),
        }
        let err = decode_data_payload("not*base64!", false).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRequest);
        assert!(err.to_string().starts_with("Invalid data URL"), "{err}");
    }

    #[test]
    fn redaction_drops_credentials_and_query() {
        let url = Url::parse("https://user:pw@example.com/a.png?token=secret#x").unwrap();
        assert_eq!(redact(&url), "https://example.com/a.png");
    }

    #[test]
    fn limits_per_modality() {
        let l = FetchLimits::default();
        assert_eq!(l.max_bytes_for(Modality::Audio), 25 * 1024 * 1024);
        assert_eq!(l.max_bytes_for(Modality::Video), 256 * 1024 * 1024);
        assert_eq!(l.timeout_for(Modality::Image), Duration::from_secs(5));
        assert_eq!(l.timeout_for(Modality::Video), Duration::from_secs(30));
    }
}
