//! What the front service does besides its core (see [`super::front`]), each only when a flag
//! asks for it: CORS (`--allowed-origins`, `--allowed-methods`, `--allowed-headers`,
//! `--allow-credentials`, answered as Starlette's CORS middleware under `vllm serve` answers
//! them), a path prefix (`--root-path`) and the access log's settings.

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS,
    ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use axum::http::{HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;

/// The front service's optional parts.
#[derive(Debug, Clone)]
pub struct FrontOptions {
    pub cors: Option<Cors>,
    /// `--root-path`, without a trailing `/`; empty: none.
    pub root_path: String,
    /// `--disable-uvicorn-access-log` turns it off.
    pub access_log: bool,
    /// `--disable-access-log-for-endpoints`.
    pub access_log_skip: Vec<String>,
}

impl Default for FrontOptions {
    fn default() -> Self {
        FrontOptions {
            cors: None,
            root_path: String::new(),
            access_log: true,
            access_log_skip: Vec::new(),
        }
    }
}

impl FrontOptions {
    /// Whether a request to `path` gets an access log line.
    pub fn logs(&self, path: &str) -> bool {
        self.access_log && !self.access_log_skip.iter().any(|p| p == path)
    }

    /// Serve `/PREFIX/x` as `/x` (requests without the prefix are served as they are, as
    /// Starlette routes under a root path).
    pub fn strip_root(&self, req: &mut Request) {
        if self.root_path.is_empty() {
            return;
        }
        let path = req.uri().path();
        let Some(rest) = path.strip_prefix(self.root_path.as_str()) else {
            return;
        };
        if !(rest.is_empty() || rest.starts_with('/')) {
            return;
        }
        let rest = if rest.is_empty() { "/" } else { rest };
        let path_and_query = match req.uri().query() {
            Some(q) => format!("{rest}?{q}"),
            None => rest.to_string(),
        };
        let mut parts = req.uri().clone().into_parts();
        if let Ok(pq) = path_and_query.parse() {
            parts.path_and_query = Some(pq);
            if let Ok(uri) = Uri::from_parts(parts) {
                *req.uri_mut() = uri;
            }
        }
    }
}

/// The CORS policy.
#[derive(Debug, Clone)]
pub struct Cors {
    /// Allowed origins; `None`: any (`*`).
    pub origins: Option<Vec<String>>,
    /// Allowed methods; `None`: any.
    pub methods: Option<Vec<String>>,
    /// Allowed request headers; `None`: any.
    pub headers: Option<Vec<String>>,
    pub credentials: bool,
}

/// The methods a preflight allows when any is.
const ALL_METHODS: &str = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT";

impl Cors {
    /// From the flags' JSON lists (`["*"]` is any; an absent flag is any, as vLLM's default).
    pub fn from_flags(
        origins: Option<&str>,
        methods: Option<&str>,
        headers: Option<&str>,
        credentials: bool,
    ) -> Result<Self, String> {
        let list = |flag: &str, text: Option<&str>| -> Result<Option<Vec<String>>, String> {
            let Some(text) = text else { return Ok(None) };
            let items: Vec<String> = serde_json::from_str(text)
                .map_err(|_| format!("{flag} must be a JSON list of strings, got: {text}"))?;
            Ok((!items.iter().any(|i| i == "*")).then_some(items))
        };
        Ok(Cors {
            origins: list("--allowed-origins", origins)?,
            methods: list("--allowed-methods", methods)?
                .map(|m| m.into_iter().map(|m| m.to_ascii_uppercase()).collect()),
            headers: list("--allowed-headers", headers)?
                .map(|h| h.into_iter().map(|h| h.to_ascii_lowercase()).collect()),
            credentials,
        })
    }

    fn allows_origin(&self, origin: &str) -> bool {
        self.origins
            .as_ref()
            .is_none_or(|list| list.iter().any(|o| o == origin))
    }

    /// The answer to a preflight request (`OPTIONS` with an Origin and
    /// Access-Control-Request-Method), or `None` when the request is not one.
    pub fn preflight(&self, req: &Request) -> Option<Response> {
        if req.method() != Method::OPTIONS {
            return None;
        }
        let origin = req.headers().get(ORIGIN)?.clone();
        let method = req.headers().get(ACCESS_CONTROL_REQUEST_METHOD)?;
        let asked_headers = req.headers().get(ACCESS_CONTROL_REQUEST_HEADERS);
        let origin_ok = origin.to_str().is_ok_and(|o| self.allows_origin(o));
        let method_ok = self.methods.as_ref().is_none_or(|list| {
            method
                .to_str()
                .is_ok_and(|m| list.iter().any(|a| a.eq_ignore_ascii_case(m)))
        });
        let headers_ok = match (&self.headers, asked_headers) {
            (Some(list), Some(asked)) => asked.to_str().is_ok_and(|asked| {
                asked
                    .split(',')
                    .map(|h| h.trim().to_ascii_lowercase())
                    .filter(|h| !h.is_empty())
                    .all(|h| list.contains(&h) || is_safelisted(&h))
            }),
            _ => true,
        };
        let mut builder = Response::builder();
        let headers = builder.headers_mut()?;
        headers.insert(
            ACCESS_CONTROL_ALLOW_ORIGIN,
            self.allow_origin_value(&origin),
        );
        if self.origins.is_some() || self.credentials {
            headers.insert(VARY, HeaderValue::from_static("Origin"));
        }
        let methods = self
            .methods
            .as_ref()
            .map_or(ALL_METHODS.to_string(), |m| m.join(", "));
        if let Ok(v) = HeaderValue::from_str(&methods) {
            headers.insert(ACCESS_CONTROL_ALLOW_METHODS, v);
        }
        let allowed_headers = match (&self.headers, asked_headers) {
            (None, Some(asked)) => Some(asked.clone()),
            (Some(list), _) => HeaderValue::from_str(&list.join(", ")).ok(),
            (None, None) => None,
        };
        if let Some(v) = allowed_headers {
            headers.insert(ACCESS_CONTROL_ALLOW_HEADERS, v);
        }
        headers.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        if self.credentials {
            headers.insert(
                ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        let (status, body) = if origin_ok && method_ok && headers_ok {
            (StatusCode::OK, "OK")
        } else {
            (StatusCode::BAD_REQUEST, "Disallowed CORS request")
        };
        builder.status(status).body(Body::from(body)).ok()
    }

    /// The headers a response to a request from `origin` gets; `None` when the origin is
    /// not allowed (the browser then withholds the response from the page).
    pub fn response_headers(
        &self,
        origin: &HeaderValue,
    ) -> Option<Vec<(axum::http::HeaderName, HeaderValue)>> {
        if !origin.to_str().is_ok_and(|o| self.allows_origin(o)) {
            return None;
        }
        let mut out = vec![(ACCESS_CONTROL_ALLOW_ORIGIN, self.allow_origin_value(origin))];
        if self.origins.is_some() || self.credentials {
            out.push((VARY, HeaderValue::from_static("Origin")));
        }
        if self.credentials {
            out.push((
                ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            ));
        }
        Some(out)
    }

    /// `*` when any origin is allowed without credentials, else the origin itself.
    fn allow_origin_value(&self, origin: &HeaderValue) -> HeaderValue {
        if self.origins.is_none() && !self.credentials {
            HeaderValue::from_static("*")
        } else {
            origin.clone()
        }
    }
}

/// Request headers a preflight allows whatever the list says (the CORS safelist).
fn is_safelisted(header: &str) -> bool {
    matches!(
        header,
        "accept" | "accept-language" | "content-language" | "content-type"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preflight(cors: &Cors, origin: &str, method: &str, headers: Option<&str>) -> Response {
        let mut req = Request::builder()
            .method(Method::OPTIONS)
            .uri("/v1/chat/completions")
            .header(ORIGIN, origin)
            .header(ACCESS_CONTROL_REQUEST_METHOD, method);
        if let Some(h) = headers {
            req = req.header(ACCESS_CONTROL_REQUEST_HEADERS, h);
        }
        let req = req.body(Body::empty()).unwrap();
        cors.preflight(&req).expect("a preflight")
    }

    #[test]
    fn any_origin_gets_a_star_and_listed_origins_get_themselves() {
        let any = Cors::from_flags(Some(r#"["*"]"#), None, None, false).unwrap();
        let r = preflight(&any, "https://a.example", "POST", Some("authorization"));
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        assert_eq!(r.headers()[ACCESS_CONTROL_ALLOW_HEADERS], "authorization");

        let listed = Cors::from_flags(
            Some(r#"["https://a.example"]"#),
            Some(r#"["post"]"#),
            None,
            true,
        )
        .unwrap();
        let r = preflight(&listed, "https://a.example", "POST", None);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.headers()[ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://a.example"
        );
        assert_eq!(r.headers()[ACCESS_CONTROL_ALLOW_CREDENTIALS], "true");
        assert_eq!(r.headers()[ACCESS_CONTROL_ALLOW_METHODS], "POST");
        assert_eq!(
            preflight(&listed, "https://b.example", "POST", None).status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            preflight(&listed, "https://a.example", "DELETE", None).status(),
            StatusCode::BAD_REQUEST
        );
        let origin = HeaderValue::from_static("https://b.example");
        assert!(listed.response_headers(&origin).is_none());
    }

    #[test]
    fn a_bad_list_is_refused_naming_the_flag() {
        let err = Cors::from_flags(Some("*"), None, None, false).unwrap_err();
        assert!(err.contains("--allowed-origins"), "{err}");
    }

    #[test]
    fn the_root_path_is_stripped_when_present() {
        let options = FrontOptions {
            root_path: "/llm".into(),
            ..FrontOptions::default()
        };
        let strip = |uri: &str| {
            let mut req = Request::builder().uri(uri).body(Body::empty()).unwrap();
            options.strip_root(&mut req);
            req.uri().to_string()
        };
        assert_eq!(strip("/llm/v1/models?x=1"), "/v1/models?x=1");
        assert_eq!(strip("/llm"), "/");
        assert_eq!(strip("/v1/models"), "/v1/models");
        assert_eq!(strip("/llmx/v1/models"), "/llmx/v1/models");
    }
}
