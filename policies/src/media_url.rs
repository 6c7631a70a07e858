//! Media URL decisions (CONTRACT section 4, incl. "Beyond vLLM").
//!
//! * [`parse_media_url`] splits a URL into [`MediaUrl::Data`], [`MediaUrl::Http`]
//!   or [`MediaUrl::File`]; any other scheme is a 400. `data:` URLs are parsed by
//!   hand (never handed to a URL parser, which would copy a payload of many
//!   megabytes): they must contain `,` and their header must end with `;base64`
//!   (other parameters such as `;charset=` are allowed); `data:text/plain,hello`
//!   is a 400 saying it is not base64 (vLLM answers 501 there).
//! * [`MediaUrlPolicy`] holds the server's settings and makes the decisions:
//!   the data URL length bound (checked before decoding), exact-host matching of
//!   http(s) URLs against `--allowed-media-domains` after the `url` crate's
//!   WHATWG normalisation (so `http://a\@b/` is host `a`, exactly as the fetcher
//!   that uses the same parsed URL will see it), SSRF refusal of non-public
//!   addresses ([`crate::ip`]), redirect targets, and `file:` paths, which must
//!   resolve (symlinks included) to a file under `--allowed-local-media-path`.
//!
//! The fetcher (preprocess) resolves a host, calls
//! [`MediaUrlPolicy::check_resolved_ip`] on each address and connects to the
//! address it checked; on a redirect it calls
//! [`MediaUrlPolicy::check_redirect`]. The only I/O here is the
//! canonicalisation of `file:` paths.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use url::{Host, Url};

use crate::error::PolicyError;
use crate::ip::classify_ip;

/// The download size cap's default (256 MiB), as decoded bytes.
pub const DEFAULT_MAX_MEDIA_BYTES: usize = 256 * 1024 * 1024;

/// Default bound on a data URL's (base64) payload: the base64 length of
/// [`DEFAULT_MAX_MEDIA_BYTES`].
pub const DEFAULT_MAX_DATA_URL_BYTES: usize = base64_encoded_len(DEFAULT_MAX_MEDIA_BYTES);

/// The longest `data:` header (media type and parameters) accepted.
pub const MAX_DATA_URL_HEADER_BYTES: usize = 1024;

/// Redirects followed for one media URL, at most.
pub const MAX_REDIRECTS: usize = 3;

/// The length of the padded base64 encoding of `n` bytes.
pub const fn base64_encoded_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

/// A parsed `data:` URL. The payload is borrowed from the URL string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataUrl<'a> {
    /// The media type, lower-cased (`image/png`); empty when the URL gives none
    /// (`data:;base64,...`), in which case the decoder sniffs the content.
    pub mime: String,
    /// Parameters between the media type and `;base64`, e.g. `("charset",
    /// Some("utf-8"))`; names lower-cased, values as given.
    pub params: Vec<(String, Option<String>)>,
    /// Everything after the first `,`: base64 text, not yet decoded. For
    /// `data:video/jpeg;base64,<f1>,<f2>,...` it holds all the frames.
    pub payload: &'a str,
}

impl DataUrl<'_> {
    /// An upper bound on the number of decoded bytes (for sizing and limits
    /// before decoding). Garbage base64 is found by the decoder, not here.
    pub fn decoded_len_upper_bound(&self) -> usize {
        (self.payload.len() / 4 + 1) * 3
    }

    /// True for `video/jpeg`, whose payload is a comma-separated list of JPEG
    /// frames.
    pub fn is_jpeg_frame_list(&self) -> bool {
        self.mime == "video/jpeg"
    }

    /// The payload split at `,` (one part for ordinary data URLs; one per frame
    /// for `video/jpeg`).
    pub fn payload_parts(&self) -> impl Iterator<Item = &str> {
        self.payload.split(',')
    }
}

/// A media URL, split by scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaUrl<'a> {
    /// `data:<mime>[;params];base64,<payload>`.
    Data(DataUrl<'a>),
    /// `http:` or `https:`, normalised by the `url` crate; it has a host.
    Http(Url),
    /// `file:`: the path as the URL names it (percent-decoded, not yet checked
    /// or canonicalised; see [`MediaUrlPolicy::check_file_path`]).
    File(PathBuf),
}

/// Parses a media URL's syntax (no policy applied; see [`MediaUrlPolicy::check_url`]).
pub fn parse_media_url(url: &str) -> Result<MediaUrl<'_>, PolicyError> {
    // Leading spaces and control characters are dropped, as the URL parser does.
    let url = url.trim_start_matches(|c: char| c <= ' ');
    if url
        .get(..5)
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case("data:"))
    {
        return parse_data_url(&url[5..]).map(MediaUrl::Data);
    }
    let parsed = Url::parse(url).map_err(|e| PolicyError::InvalidMediaUrl {
        reason: e.to_string(),
    })?;
    match parsed.scheme() {
        "http" | "https" => {
            if parsed.host().is_none() {
                return Err(PolicyError::InvalidMediaUrl {
                    reason: "the URL has no host".to_owned(),
                });
            }
            Ok(MediaUrl::Http(parsed))
        }
        "file" => {
            let path = parsed
                .to_file_path()
                .map_err(|()| PolicyError::LocalPathNotAllowed {
                    path: parsed.path().to_owned(),
                    reason: "file: URLs must be absolute local paths without a host".to_owned(),
                })?;
            Ok(MediaUrl::File(path))
        }
        other => Err(PolicyError::UnsupportedUrlScheme {
            scheme: other.to_owned(),
        }),
    }
}

/// Parses what follows `data:`.
fn parse_data_url(rest: &str) -> Result<DataUrl<'_>, PolicyError> {
    let invalid = |reason: &str| PolicyError::InvalidDataUrl {
        reason: reason.to_owned(),
    };
    let Some(comma) = rest.find(',') else {
        return Err(invalid("it has no ',' separating the header from the data"));
    };
    if comma > MAX_DATA_URL_HEADER_BYTES {
        return Err(PolicyError::InvalidDataUrl {
            reason: format!("its header is longer than {MAX_DATA_URL_HEADER_BYTES} bytes"),
        });
    }
    let (header, payload) = (&rest[..comma], &rest[comma + 1..]);
    let mut segments: Vec<&str> = header.split(';').collect();
    let is_base64 = segments.len() > 1
        && segments
            .last()
            .is_some_and(|last| last.trim().eq_ignore_ascii_case("base64"));
    if !is_base64 {
        return Err(invalid(
            "it is not base64-encoded (its header must end with ';base64'); only base64 data \
             URLs are supported",
        ));
    }
    segments.pop();
    let mime = segments
        .first()
        .map_or("", |m| m.trim())
        .to_ascii_lowercase();
    if !mime.is_empty() && !is_media_type(&mime) {
        return Err(PolicyError::InvalidDataUrl {
            reason: format!("the media type '{mime}' is not of the form type/subtype"),
        });
    }
    let params = segments
        .iter()
        .skip(1)
        .map(|param| match param.split_once('=') {
            Some((name, value)) => (name.trim().to_ascii_lowercase(), Some(value.to_owned())),
            None => (param.trim().to_ascii_lowercase(), None),
        })
        .collect();
    if payload.is_empty() {
        return Err(invalid("its payload is empty"));
    }
    Ok(DataUrl {
        mime,
        params,
        payload,
    })
}

fn is_media_type(mime: &str) -> bool {
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    mime.split_once('/')
        .is_some_and(|(kind, sub)| token(kind) && token(sub))
}

/// Refuses a non-public address with no exemption (see
/// [`MediaUrlPolicy::check_resolved_ip`] for the exemptions).
pub fn check_ip_is_public(ip: IpAddr, host: &str) -> Result<(), PolicyError> {
    let class = classify_ip(ip);
    if class.is_public() {
        Ok(())
    } else {
        Err(PolicyError::NonPublicAddress {
            host: host.to_owned(),
            ip,
            class,
        })
    }
}

/// The server's media URL settings.
///
/// Build it with [`MediaUrlPolicy::new`] at start-up (which checks the local
/// path and normalises the domain list), or as a struct literal over
/// [`MediaUrlPolicy::default`]; the checks do not rely on `new`'s
/// normalisation (entries are compared in normalised form, the root is
/// canonicalised again when a `file:` URL is checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaUrlPolicy {
    /// `--allowed-local-media-path`: `file:` URLs must resolve under it; `None`
    /// refuses every `file:` URL.
    pub allowed_local_media_path: Option<PathBuf>,
    /// `--allowed-media-domains`: exact hosts http(s) URLs may name; `None` or
    /// an empty list means any host. A listed host is also exempt from the
    /// SSRF refusal.
    pub allowed_media_domains: Option<Vec<String>>,
    /// `--allow-private-media-hosts`: turns the SSRF refusal off.
    pub allow_private_hosts: bool,
    /// Bound on a data URL's payload (bytes of base64), checked before decoding.
    pub max_data_url_bytes: usize,
}

impl Default for MediaUrlPolicy {
    /// No local files, any public host, private hosts refused, the default
    /// data URL bound.
    fn default() -> Self {
        MediaUrlPolicy {
            allowed_local_media_path: None,
            allowed_media_domains: None,
            allow_private_hosts: false,
            max_data_url_bytes: DEFAULT_MAX_DATA_URL_BYTES,
        }
    }
}

impl MediaUrlPolicy {
    /// Builds the policy at start-up.
    ///
    /// * `allowed_local_media_path` is canonicalised; it must be an existing
    ///   directory.
    /// * `allowed_media_domains` entries are normalised as URL hosts are
    ///   (lower case, IDNA, IP literals in canonical form, a trailing dot
    ///   dropped); an empty list means "no restriction", as in vLLM.
    /// * `allow_private_hosts` turns the SSRF refusal off.
    pub fn new(
        allowed_local_media_path: Option<&Path>,
        allowed_media_domains: Option<&[String]>,
        allow_private_hosts: bool,
    ) -> Result<Self, PolicyError> {
        let allowed_local_media_path = allowed_local_media_path
            .map(|root| {
                let canonical = root
                    .canonicalize()
                    .map_err(|e| PolicyError::InvalidConfig {
                        option: "--allowed-local-media-path".to_owned(),
                        reason: format!("'{}': {e}", root.display()),
                    })?;
                if !canonical.is_dir() {
                    return Err(PolicyError::InvalidConfig {
                        option: "--allowed-local-media-path".to_owned(),
                        reason: format!("'{}' is not a directory", root.display()),
                    });
                }
                Ok(canonical)
            })
            .transpose()?;
        let allowed_media_domains = match allowed_media_domains {
            None | Some([]) => None,
            Some(entries) => Some(
                entries
                    .iter()
                    .map(|entry| normalise_domain_entry(entry))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Ok(MediaUrlPolicy {
            allowed_local_media_path,
            allowed_media_domains,
            allow_private_hosts,
            max_data_url_bytes: DEFAULT_MAX_DATA_URL_BYTES,
        })
    }

    /// Sets the bound on a data URL's payload length (bytes of base64).
    pub fn with_max_data_url_bytes(mut self, max: usize) -> Self {
        self.max_data_url_bytes = max;
        self
    }

    /// Parses a media URL and applies every decision that needs no network:
    /// the data URL bound, the http(s) host rules (incl. IP literals), and
    /// the `file:` rules. A returned [`MediaUrl::File`] holds the canonical
    /// path to open.
    pub fn check_url<'a>(&self, url: &'a str) -> Result<MediaUrl<'a>, PolicyError> {
        match parse_media_url(url)? {
            MediaUrl::Data(data) => {
                self.check_data_url(&data)?;
                Ok(MediaUrl::Data(data))
            }
            MediaUrl::Http(parsed) => {
                self.check_http_host(&parsed)?;
                Ok(MediaUrl::Http(parsed))
            }
            MediaUrl::File(path) => self.check_file_path(&path).map(MediaUrl::File),
        }
    }

    /// The data URL length bound, checked before decoding.
    pub fn check_data_url(&self, data: &DataUrl<'_>) -> Result<(), PolicyError> {
        if data.payload.len() > self.max_data_url_bytes {
            return Err(PolicyError::DataUrlTooLarge {
                len: data.payload.len(),
                max: self.max_data_url_bytes,
            });
        }
        Ok(())
    }

    /// Checks an http(s) URL's host: exact match against
    /// `--allowed-media-domains` when set; and when the host is an IP literal
    /// it must be public unless exempt (see [`Self::check_resolved_ip`]).
    /// A domain name's addresses are checked after resolution, by the fetcher.
    pub fn check_http_host(&self, url: &Url) -> Result<(), PolicyError> {
        let host = url.host().ok_or_else(|| PolicyError::InvalidMediaUrl {
            reason: "the URL has no host".to_owned(),
        })?;
        let normalised = normalise_host(&host);
        if let Some(allowed) = self.domain_list() {
            if !allowed
                .iter()
                .any(|entry| entry_matches(entry, &normalised))
            {
                return Err(PolicyError::MediaDomainNotAllowed {
                    host: normalised,
                    allowed: allowed.join(", "),
                });
            }
        }
        let ip = match host {
            Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
            Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
            Host::Domain(_) => None,
        };
        match ip {
            Some(ip) => self.check_resolved_ip(ip, &normalised),
            None => Ok(()),
        }
    }

    /// Checks an address a media host resolved to (or an IP literal). Refused
    /// when not public ([`crate::ip::classify_ip`]), unless the server allows
    /// private hosts or `host` is listed in `--allowed-media-domains`.
    pub fn check_resolved_ip(&self, ip: IpAddr, host: &str) -> Result<(), PolicyError> {
        if self.allow_private_hosts || self.is_explicitly_allowed(host) {
            return Ok(());
        }
        check_ip_is_public(ip, host)
    }

    /// The domain restriction, if any (an empty list restricts nothing).
    fn domain_list(&self) -> Option<&[String]> {
        self.allowed_media_domains
            .as_deref()
            .filter(|list| !list.is_empty())
    }

    fn is_explicitly_allowed(&self, host: &str) -> bool {
        let Some(allowed) = self.domain_list() else {
            return false;
        };
        match normalise_domain_entry(host) {
            Ok(normalised) => allowed
                .iter()
                .any(|entry| entry_matches(entry, &normalised)),
            Err(_) => false,
        }
    }

    /// Checks a redirect: `redirects_so_far` is how many were already followed
    /// (at most [`MAX_REDIRECTS`]); the target must be http(s) and pass
    /// [`Self::check_http_host`].
    pub fn check_redirect(&self, target: &Url, redirects_so_far: usize) -> Result<(), PolicyError> {
        if redirects_so_far >= MAX_REDIRECTS {
            return Err(PolicyError::TooManyRedirects { max: MAX_REDIRECTS });
        }
        match target.scheme() {
            "http" | "https" => self.check_http_host(target),
            other => Err(PolicyError::RedirectScheme {
                scheme: other.to_owned(),
            }),
        }
    }

    /// Checks a `file:` path and returns its canonical form: it must exist,
    /// be a regular file, and resolve (after `..` and symlinks) to a path under
    /// `--allowed-local-media-path`. Without that option every path is refused
    /// (a 400, never a 500).
    pub fn check_file_path(&self, path: &Path) -> Result<PathBuf, PolicyError> {
        let root = self
            .allowed_local_media_path
            .as_deref()
            .ok_or(PolicyError::LocalMediaDisabled)?;
        let refuse = |reason: &str| PolicyError::LocalPathNotAllowed {
            path: path.display().to_string(),
            reason: reason.to_owned(),
        };
        let root = root
            .canonicalize()
            .map_err(|_| refuse("the allowed local media directory cannot be resolved"))?;
        let canonical = path
            .canonicalize()
            .map_err(|_| refuse("it does not exist or cannot be accessed"))?;
        if !canonical.starts_with(&root) {
            return Err(refuse("it is outside --allowed-local-media-path"));
        }
        if !canonical.is_file() {
            return Err(refuse("it is not a regular file"));
        }
        Ok(canonical)
    }
}

/// Whether an allowed-domain entry (normalised or not) names the normalised host.
fn entry_matches(entry: &str, normalised_host: &str) -> bool {
    entry == normalised_host
        || normalise_domain_entry(entry).is_ok_and(|entry| entry == normalised_host)
}

/// A host as the allowed-domain list stores it: its URL serialisation
/// (`[::1]` for IPv6) without a trailing dot.
fn normalise_host<S: AsRef<str>>(host: &Host<S>) -> String {
    let text = host.to_string();
    match text.strip_suffix('.') {
        Some(stripped) if matches!(host, Host::Domain(_)) => stripped.to_owned(),
        _ => text,
    }
}

fn normalise_domain_entry(entry: &str) -> Result<String, PolicyError> {
    let trimmed = entry.trim();
    let bracketed;
    let input = if trimmed.contains(':') && !trimmed.starts_with('[') {
        bracketed = format!("[{trimmed}]");
        bracketed.as_str()
    } else {
        trimmed
    };
    let host = Host::parse(input).map_err(|e| PolicyError::InvalidConfig {
        option: "--allowed-media-domains".to_owned(),
        reason: format!("'{entry}' is not a valid host name ({e})"),
    })?;
    Ok(normalise_host(&host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn policy(domains: Option<&[&str]>, private: bool) -> MediaUrlPolicy {
        let domains: Option<Vec<String>> =
            domains.map(|d| d.iter().map(|s| (*s).to_owned()).collect());
        MediaUrlPolicy::new(None, domains.as_deref(), private).expect("policy")
    }

    fn url(s: &str) -> Url {
        Url::parse(s).expect("url")
    }

    // ----- data URLs -----

    #[test]
    fn data_url_ok_with_params() {
        let parsed = parse_media_url("data:image/png;charset=utf-8;base64,iVBORw0K").expect("ok");
        let MediaUrl::Data(data) = parsed else {
            panic!("not data: {parsed:?}");
        };
        assert_eq!(data.mime, "image/png");
        assert_eq!(
            data.params,
            vec![("charset".to_owned(), Some("utf-8".to_owned()))]
        );
        assert_eq!(data.payload, "iVBORw0K");
        assert_eq!(data.decoded_len_upper_bound(), 9);
        assert!(data.decoded_len_upper_bound() >= 6);
        assert!(!data.is_jpeg_frame_list());
    }

    #[test]
    fn data_url_case_insensitive_scheme_and_base64() {
        let parsed = parse_media_url("DATA:Image/JPEG;BASE64,/9j/").expect("ok");
        assert!(matches!(parsed, MediaUrl::Data(ref d) if d.mime == "image/jpeg"));
    }

    #[test]
    fn data_url_frame_list() {
        let MediaUrl::Data(data) =
            parse_media_url("data:video/jpeg;base64,AAAA,BBBB,CCCC").expect("ok")
        else {
            panic!("not data");
        };
        assert!(data.is_jpeg_frame_list());
        assert_eq!(
            data.payload_parts().collect::<Vec<_>>(),
            ["AAAA", "BBBB", "CCCC"]
        );
    }

    #[test]
    fn data_url_not_base64_is_a_400() {
        let err = parse_media_url("data:text/plain,hello").expect_err("not base64");
        assert_eq!(err.status(), 400);
        assert!(err.message().contains("not base64"), "{}", err.message());
        assert_eq!(
            err.message(),
            "Invalid data URL: it is not base64-encoded (its header must end with ';base64'); \
             only base64 data URLs are supported"
        );
        // A ;base64 that is not last is not base64 either.
        assert!(parse_media_url("data:image/png;base64;charset=x,AAAA").is_err());
        // Only a media type, no ;base64.
        assert!(parse_media_url("data:base64,AAAA").is_err());
    }

    #[test]
    fn data_url_without_comma_or_payload() {
        let err = parse_media_url("data:image/png;base64").expect_err("no comma");
        assert!(err.message().contains("no ','"), "{}", err.message());
        let err = parse_media_url("data:image/png;base64,").expect_err("empty");
        assert!(err.message().contains("empty"), "{}", err.message());
        let err = parse_media_url("data:notamime;base64,AAAA").expect_err("mime");
        assert!(err.message().contains("type/subtype"), "{}", err.message());
        assert!(parse_media_url("data:;base64,AAAA").is_ok());
        let long = format!("data:image/png;{};base64,AAAA", "x=y;".repeat(300));
        let err = parse_media_url(&long).expect_err("long header");
        assert!(
            err.message().contains("header is longer than 1024 bytes"),
            "{err}"
        );
        // Leading whitespace does not hide the scheme.
        assert!(matches!(
            parse_media_url("  data:image/png;base64,AAAA"),
            Ok(MediaUrl::Data(_))
        ));
    }

    #[test]
    fn data_url_length_bound_before_decoding() {
        let p = MediaUrlPolicy::default().with_max_data_url_bytes(8);
        assert!(p.check_url("data:image/png;base64,AAAAAAAA").is_ok());
        let err = p
            .check_url("data:image/png;base64,AAAAAAAAAAAA")
            .expect_err("big");
        assert_eq!(
            err.message(),
            "The data URL payload is 12 bytes, more than the maximum of 8 bytes"
        );
        assert_eq!(err.status(), 400);
        assert_eq!(DEFAULT_MAX_DATA_URL_BYTES, 357_913_944);
        assert_eq!(base64_encoded_len(1), 4);
        assert_eq!(base64_encoded_len(3), 4);
        assert_eq!(base64_encoded_len(4), 8);
    }

    // ----- schemes -----

    #[test]
    fn other_schemes_are_400() {
        for bad in [
            "ftp://example.com/a.png",
            "gopher://x/",
            "javascript:alert(1)",
            "s3://b/k",
        ] {
            let err = parse_media_url(bad).expect_err(bad);
            assert!(
                matches!(err, PolicyError::UnsupportedUrlScheme { .. }),
                "{bad}"
            );
            assert_eq!(err.status(), 400);
        }
        let err = parse_media_url("ftp://example.com/a.png").expect_err("ftp");
        assert_eq!(
            err.message(),
            "The URL scheme 'ftp' is not supported for media; use a data:, http:, https: or file: URL"
        );
        let err = parse_media_url("not a url").expect_err("garbage");
        assert!(matches!(err, PolicyError::InvalidMediaUrl { .. }));
    }

    #[test]
    fn http_urls_parse_and_normalise() {
        let MediaUrl::Http(u) = parse_media_url("HTTPS://Example.COM/a.png").expect("ok") else {
            panic!("not http");
        };
        assert_eq!(u.host_str(), Some("example.com"));
        assert_eq!(u.scheme(), "https");
    }

    // ----- allowed domains -----

    #[test]
    fn exact_host_match() {
        let p = policy(Some(&["example.com"]), false);
        assert!(p.check_url("https://example.com/cat.png").is_ok());
        assert!(p.check_url("https://EXAMPLE.com./cat.png").is_ok());
        for bad in [
            "https://sub.example.com/cat.png",
            "https://example.com.evil.net/cat.png",
            "https://evilexample.com/cat.png",
        ] {
            let err = p.check_url(bad).expect_err(bad);
            assert!(
                matches!(err, PolicyError::MediaDomainNotAllowed { .. }),
                "{bad}"
            );
        }
        let err = p.check_url("https://other.org/x").expect_err("other");
        assert_eq!(
            err.message(),
            "The media URL host 'other.org' is not allowed; allowed domains: example.com (see \
             --allowed-media-domains)"
        );
    }

    #[test]
    fn backslash_trick_is_host_a() {
        // WHATWG: in special schemes '\' is a path separator, so the host is 'a'.
        let MediaUrl::Http(u) = parse_media_url("http://a\\@b/").expect("parse") else {
            panic!("not http");
        };
        assert_eq!(u.host_str(), Some("a"));
        let only_a = policy(Some(&["a"]), false);
        assert!(only_a.check_url("http://a\\@b/").is_ok());
        let only_b = policy(Some(&["b"]), false);
        let err = only_b
            .check_url("http://a\\@b/")
            .expect_err("must not be host b");
        assert!(matches!(err, PolicyError::MediaDomainNotAllowed { ref host, .. } if host == "a"));
        // Userinfo is not the host either.
        let err = only_b.check_url("http://b@a/").expect_err("userinfo");
        assert!(matches!(err, PolicyError::MediaDomainNotAllowed { ref host, .. } if host == "a"));
    }

    #[test]
    fn domain_entries_are_normalised() {
        let p = policy(
            Some(&["Example.COM.", " bücher.example ", "::1", "[2001:db8::1]"]),
            false,
        );
        assert_eq!(
            p.allowed_media_domains.as_deref(),
            Some(
                &[
                    "example.com".to_owned(),
                    "xn--bcher-kva.example".to_owned(),
                    "[::1]".to_owned(),
                    "[2001:db8::1]".to_owned(),
                ][..]
            )
        );
        assert!(p.check_url("http://bücher.example/x.png").is_ok());
        assert!(MediaUrlPolicy::new(None, Some(&["exa mple.com".to_owned()]), false).is_err());
        // An empty list means no restriction.
        let open = MediaUrlPolicy::new(None, Some(&[]), false).expect("policy");
        assert_eq!(open.allowed_media_domains, None);
        // A struct literal with unnormalised entries behaves the same.
        let literal = MediaUrlPolicy {
            allowed_media_domains: Some(vec!["Example.COM.".to_owned()]),
            ..MediaUrlPolicy::default()
        };
        assert!(literal.check_url("https://example.com/x.png").is_ok());
        assert!(literal.check_url("https://other.com/x.png").is_err());
        assert!(literal
            .check_resolved_ip("127.0.0.1".parse().expect("ip"), "example.com")
            .is_ok());
        let empty = MediaUrlPolicy {
            allowed_media_domains: Some(Vec::new()),
            ..MediaUrlPolicy::default()
        };
        assert!(empty.check_url("https://any.example/x.png").is_ok());
    }

    // ----- SSRF -----

    #[test]
    fn ip_literals_are_checked() {
        let p = policy(None, false);
        let err = p
            .check_url("http://127.0.0.1:8000/x.png")
            .expect_err("loopback");
        assert_eq!(
            err.message(),
            "Media URL host '127.0.0.1' resolves to 127.0.0.1, a loopback address; fetching \
             from non-public addresses is refused (start with --allow-private-media-hosts or \
             list the host in --allowed-media-domains to allow it)"
        );
        assert_eq!(err.status(), 400);
        for bad in [
            "http://169.254.169.254/latest/meta-data/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[fe80::1]/",
            "http://10.0.0.1/",
            "http://0x7f000001/",
            "http://2130706433/",
            "http://127.1/",
            "http://0/",
        ] {
            let err = p.check_url(bad).expect_err(bad);
            assert!(
                matches!(err, PolicyError::NonPublicAddress { .. }),
                "{bad}: {err}"
            );
        }
        assert!(p.check_url("http://8.8.8.8/x.png").is_ok());
        assert!(p.check_url("http://[2606:4700:4700::1111]/").is_ok());
        assert!(p.check_url("http://example.com/").is_ok());
    }

    #[test]
    fn resolved_ips_are_checked_with_exemptions() {
        let strict = policy(None, false);
        let loopback: IpAddr = "127.0.0.1".parse().expect("ip");
        let err = strict
            .check_resolved_ip(loopback, "internal.example")
            .expect_err("loopback");
        assert!(err.message().starts_with(
            "Media URL host 'internal.example' resolves to 127.0.0.1, a loopback address;"
        ));
        let mapped: IpAddr = "::ffff:10.0.0.5".parse().expect("ip");
        let err = strict.check_resolved_ip(mapped, "x").expect_err("mapped");
        assert!(err
            .message()
            .contains("resolves to ::ffff:10.0.0.5, a private address"));
        let unspecified: IpAddr = "0.0.0.0".parse().expect("ip");
        let err = strict
            .check_resolved_ip(unspecified, "x")
            .expect_err("unspecified");
        assert!(err.message().contains("an unspecified address"), "{err}");
        assert!(strict
            .check_resolved_ip("93.184.216.34".parse().expect("ip"), "example.com")
            .is_ok());

        let listed = policy(Some(&["internal.example", "10.0.0.1"]), false);
        assert!(listed
            .check_resolved_ip(loopback, "internal.example")
            .is_ok());
        assert!(listed
            .check_resolved_ip(loopback, "INTERNAL.example.")
            .is_ok());
        assert!(listed.check_resolved_ip(loopback, "other.example").is_err());
        assert!(listed.check_url("http://10.0.0.1/x.png").is_ok());

        let open = policy(None, true);
        assert!(open.check_resolved_ip(loopback, "anything").is_ok());
        assert!(open.check_url("http://127.0.0.1/x.png").is_ok());
        assert!(check_ip_is_public(loopback, "x").is_err());
    }

    #[test]
    fn redirects() {
        let p = policy(None, false);
        assert!(p.check_redirect(&url("https://example.com/b"), 0).is_ok());
        assert!(p.check_redirect(&url("https://example.com/b"), 2).is_ok());
        let err = p
            .check_redirect(&url("https://example.com/b"), 3)
            .expect_err("too many");
        assert_eq!(err.message(), "The media URL redirected more than 3 times");
        assert!(p.check_redirect(&url("http://127.0.0.1/"), 0).is_err());
        let err = p
            .check_redirect(&url("file:///etc/passwd"), 0)
            .expect_err("file redirect");
        assert_eq!(
            err.message(),
            "The media URL redirected to a 'file:' URL; redirects may only lead to http: or \
             https: URLs"
        );
    }

    // ----- file: URLs -----

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            let path = std::env::temp_dir().join(format!(
                "policies-test-{tag}-{}-{:?}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or_default()
            ));
            fs::create_dir_all(&path).expect("mkdir");
            TempDir(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn file_url(path: &Path) -> String {
        Url::from_file_path(path).expect("file url").to_string()
    }

    #[test]
    fn file_without_allowed_path_is_a_400() {
        let p = MediaUrlPolicy::default();
        let err = p.check_url("file:///etc/passwd").expect_err("disabled");
        assert_eq!(err, PolicyError::LocalMediaDisabled);
        assert_eq!(err.status(), 400);
        assert!(err.message().contains("--allowed-local-media-path"));
    }

    #[test]
    fn file_paths_must_stay_under_the_root() {
        let tmp = TempDir::new("file");
        let root = tmp.0.join("media");
        let outside = tmp.0.join("secret");
        fs::create_dir_all(root.join("sub")).expect("mkdir");
        fs::create_dir_all(&outside).expect("mkdir");
        fs::write(root.join("sub/cat.png"), b"png").expect("write");
        fs::write(outside.join("key.txt"), b"secret").expect("write");

        let p = MediaUrlPolicy::new(Some(&root), None, false).expect("policy");
        let canonical_root = root.canonicalize().expect("canonical");
        assert_eq!(
            p.allowed_local_media_path.as_deref(),
            Some(canonical_root.as_path())
        );

        // Inside: ok, canonical path returned.
        let inside = file_url(&root.join("sub/cat.png"));
        let MediaUrl::File(resolved) = p.check_url(&inside).expect("inside") else {
            panic!("not file");
        };
        assert_eq!(resolved, canonical_root.join("sub/cat.png"));

        // ../ escape (percent-encoded so the URL parser keeps it) is refused.
        let escape = format!("file://{}/sub/%2E%2E/%2E%2E/secret/key.txt", root.display());
        let err = p.check_url(&escape).expect_err("escape");
        assert!(
            matches!(err, PolicyError::LocalPathNotAllowed { .. }),
            "{err}"
        );
        // A direct path outside.
        let err = p
            .check_url(&file_url(&outside.join("key.txt")))
            .expect_err("outside");
        assert!(
            err.message()
                .ends_with("it is outside --allowed-local-media-path"),
            "{err}"
        );
        // The root's sibling with a common prefix is outside too.
        let sibling = tmp.0.join("media2");
        fs::create_dir_all(&sibling).expect("mkdir");
        fs::write(sibling.join("x.png"), b"x").expect("write");
        assert!(p.check_url(&file_url(&sibling.join("x.png"))).is_err());
        // Missing file and directories.
        let err = p
            .check_url(&file_url(&root.join("nope.png")))
            .expect_err("missing");
        assert!(err.message().contains("does not exist"), "{err}");
        let err = p.check_url(&file_url(&root.join("sub"))).expect_err("dir");
        assert!(err.message().contains("not a regular file"), "{err}");
        // A host in a file URL.
        let err = p.check_url("file://server/share/x.png").expect_err("host");
        assert!(matches!(err, PolicyError::LocalPathNotAllowed { .. }));
        assert_eq!(err.status(), 400);
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_out_of_the_root_are_refused() {
        let tmp = TempDir::new("symlink");
        let root = tmp.0.join("media");
        fs::create_dir_all(&root).expect("mkdir");
        fs::write(tmp.0.join("secret.txt"), b"secret").expect("write");
        fs::write(root.join("ok.png"), b"png").expect("write");
        std::os::unix::fs::symlink(tmp.0.join("secret.txt"), root.join("link.png"))
            .expect("symlink");
        std::os::unix::fs::symlink(root.join("ok.png"), root.join("inner.png")).expect("symlink");
        let p = MediaUrlPolicy::new(Some(&root), None, false).expect("policy");
        let err = p
            .check_url(&file_url(&root.join("link.png")))
            .expect_err("out");
        assert!(err.message().contains("outside"), "{err}");
        assert!(p.check_url(&file_url(&root.join("inner.png"))).is_ok());
        // A root given as a literal, non-canonical path (through a symlink) works too.
        std::os::unix::fs::symlink(&root, tmp.0.join("alias")).expect("symlink");
        let literal = MediaUrlPolicy {
            allowed_local_media_path: Some(tmp.0.join("alias")),
            ..MediaUrlPolicy::default()
        };
        assert!(literal.check_url(&file_url(&root.join("ok.png"))).is_ok());
        assert!(literal
            .check_url(&file_url(&tmp.0.join("alias/ok.png")))
            .is_ok());
        assert!(literal
            .check_url(&file_url(&root.join("link.png")))
            .is_err());
    }

    #[test]
    fn allowed_path_must_be_an_existing_directory() {
        let tmp = TempDir::new("root");
        let err =
            MediaUrlPolicy::new(Some(&tmp.0.join("missing")), None, false).expect_err("missing");
        assert!(err.is_startup_error());
        fs::write(tmp.0.join("file"), b"x").expect("write");
        let err = MediaUrlPolicy::new(Some(&tmp.0.join("file")), None, false).expect_err("file");
        assert!(err.message().contains("not a directory"), "{err}");
    }
}
