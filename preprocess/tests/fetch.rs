//! The media connector against a loopback HTTP server that counts its hits.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use policies::{MediaUrlPolicy, PolicyError};
use preprocess::error::ErrorKind;
use preprocess::fetch::{FetchError, FetchLimits, MediaFetcher, Payload};
use preprocess::pool::{DecodePool, PoolConfig};
use preprocess::{Modality, PreprocessError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A response the test server gives for a path.
#[derive(Clone)]
enum Reply {
    Ok(&'static str, Vec<u8>),
    Status(u16),
    Redirect(String),
    /// Claims a length, sends nothing more.
    ClaimsLength(u64),
    /// Chunked body of `n` bytes, no Content-Length.
    Chunked(usize),
    /// Sends one byte every 200 ms, forever.
    Trickle,
}

struct Server {
    port: u16,
    hits: Arc<AtomicUsize>,
}

async fn serve(route: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let route = Arc::new(route);
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            let route = route.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = 0;
                while !buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf[got..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got += n,
                    }
                }
                let head = String::from_utf8_lossy(&buf[..got]).to_string();
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let reply = route(&path);
                let _ = write_reply(&mut sock, reply).await;
            });
        }
    });
    Server { port, hits }
}

async fn write_reply(sock: &mut tokio::net::TcpStream, reply: Reply) -> std::io::Result<()> {
    match reply {
        Reply::Ok(ty, body) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {ty}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            sock.write_all(head.as_bytes()).await?;
            sock.write_all(&body).await?;
        }
        Reply::Status(code) => {
            let head =
                format!("HTTP/1.1 {code} Nope\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            sock.write_all(head.as_bytes()).await?;
        }
        Reply::Redirect(to) => {
            let head = format!(
                "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            sock.write_all(head.as_bytes()).await?;
        }
        Reply::ClaimsLength(n) => {
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n");
            sock.write_all(head.as_bytes()).await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        Reply::Chunked(n) => {
            sock.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                .await?;
            let chunk = vec![b'x'; 1024];
            let mut sent = 0;
            while sent < n {
                sock.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .await?;
                sock.write_all(&chunk).await?;
                sock.write_all(b"\r\n").await?;
                sent += chunk.len();
            }
            sock.write_all(b"0\r\n\r\n").await?;
        }
        Reply::Trickle => {
            sock.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                .await?;
            loop {
                sock.write_all(b"x").await?;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    sock.flush().await
}

fn pool() -> DecodePool {
    DecodePool::new(PoolConfig::default())
}

fn fetcher(policy: MediaUrlPolicy) -> MediaFetcher {
    MediaFetcher::new(policy, FetchLimits::default()).unwrap()
}

fn private_ok() -> MediaUrlPolicy {
    MediaUrlPolicy {
        allow_private_hosts: true,
        ..MediaUrlPolicy::default()
    }
}

async fn fetch(f: &MediaFetcher, url: &str) -> Result<Vec<u8>, PreprocessError> {
    match f.fetch(url, Modality::Image, &pool()).await?.payload {
        Payload::Bytes(b) => Ok(b.to_vec()),
        Payload::JpegFrames(_) => panic!("frames"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_literals_and_names_are_refused_without_a_hit() {
    let server = serve(|_| Reply::Ok("image/png", b"png".to_vec())).await;
    let f = fetcher(MediaUrlPolicy::default());
    for url in [
        format!("http://127.0.0.1:{}/a.png", server.port),
        format!("http://localhost:{}/a.png", server.port),
        format!("http://[::ffff:127.0.0.1]:{}/a.png", server.port),
        format!("http://[::1]:{}/a.png", server.port),
        "http://10.1.2.3/a.png".to_owned(),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://100.64.0.1/a.png".to_owned(),
    ] {
        let err = fetch(&f, &url).await.unwrap_err();
        assert!(
            matches!(
                err,
                PreprocessError::Policy(PolicyError::NonPublicAddress { .. })
            ),
            "{url}: {err:?}"
        );
        assert_eq!(err.kind(), ErrorKind::BadRequest, "{url}");
        assert!(
            err.to_string().contains("non-public addresses is refused"),
            "{err}"
        );
    }
    assert_eq!(server.hits.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_when_private_hosts_are_allowed() {
    let server = serve(|path| match path {
        "/a.png" => Reply::Ok("image/png; charset=binary", b"\x89PNG-bytes".to_vec()),
        _ => Reply::Status(404),
    })
    .await;
    let f = fetcher(private_ok());
    let got = f
        .fetch(
            &format!("http://localhost:{}/a.png", server.port),
            Modality::Image,
            &pool(),
        )
        .await
        .unwrap();
    assert_eq!(got.mime.as_deref(), Some("image/png"));
    match got.payload {
        Payload::Bytes(b) => assert_eq!(&b[..], b"\x89PNG-bytes"),
        Payload::JpegFrames(_) => panic!("frames"),
    }
    // Upstream 4xx is a 422 naming the status.
    let err = fetch(&f, &format!("http://127.0.0.1:{}/missing", server.port))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            PreprocessError::Fetch(FetchError::UpstreamStatus { status: 404, .. })
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), ErrorKind::Unprocessable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_domain_entry_opens_a_private_host_but_redirects_are_checked() {
    let port_holder = Arc::new(std::sync::OnceLock::<u16>::new());
    let ph = port_holder.clone();
    let server = serve(move |path| {
        let port = *ph.get().unwrap();
        match path {
            "/ok" => Reply::Ok("image/png", b"fine".to_vec()),
            "/to-localhost" => Reply::Redirect(format!("http://localhost:{port}/ok")),
            "/relative" => Reply::Redirect("/ok".to_owned()),
            "/to-ftp" => Reply::Redirect("ftp://127.0.0.1/x".to_owned()),
            "/loop" => Reply::Redirect("/loop".to_owned()),
            _ => Reply::Status(404),
        }
    })
    .await;
    port_holder.set(server.port).unwrap();
    let policy = MediaUrlPolicy::new(None, Some(&["127.0.0.1".to_owned()]), false).unwrap();
    let f = fetcher(policy);
    let base = format!("http://127.0.0.1:{}", server.port);
    assert_eq!(fetch(&f, &format!("{base}/ok")).await.unwrap(), b"fine");
    assert_eq!(
        fetch(&f, &format!("{base}/relative")).await.unwrap(),
        b"fine"
    );
    let err = fetch(&f, &format!("{base}/to-localhost"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            PreprocessError::Policy(PolicyError::MediaDomainNotAllowed { .. })
        ),
        "{err:?}"
    );
    let err = fetch(&f, &format!("{base}/to-ftp")).await.unwrap_err();
    assert!(
        matches!(
            err,
            PreprocessError::Policy(PolicyError::RedirectScheme { .. })
        ),
        "{err:?}"
    );
    let before = server.hits.load(Ordering::SeqCst);
    let err = fetch(&f, &format!("{base}/loop")).await.unwrap_err();
    assert!(
        matches!(
            err,
            PreprocessError::Policy(PolicyError::TooManyRedirects { max: 3 })
        ),
        "{err:?}"
    );
    // The first request and three redirects: four hits, no more.
    assert_eq!(server.hits.load(Ordering::SeqCst) - before, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_caps_hold_on_the_header_and_on_the_stream() {
    let server = serve(|path| match path {
        "/huge" => Reply::ClaimsLength(1 << 30),
        "/chunked" => Reply::Chunked(64 * 1024),
        _ => Reply::Status(404),
    })
    .await;
    let limits = FetchLimits {
        max_bytes: 16 * 1024,
        ..FetchLimits::default()
    };
    let f = MediaFetcher::new(private_ok(), limits).unwrap();
    for path in ["/huge", "/chunked"] {
        let err = fetch(&f, &format!("http://127.0.0.1:{}{path}", server.port))
            .await
            .unwrap_err();
        assert!(
            matches!(err, PreprocessError::Fetch(FetchError::TooLarge { .. })),
            "{path}: {err:?}"
        );
        assert_eq!(err.kind(), ErrorKind::Unprocessable);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_server_is_cut_off_by_the_timeout() {
    let server = serve(|_| Reply::Trickle).await;
    let limits = FetchLimits {
        image_timeout: Duration::from_millis(600),
        ..FetchLimits::default()
    };
    let f = MediaFetcher::new(private_ok(), limits).unwrap();
    let err = fetch(&f, &format!("http://127.0.0.1:{}/slow", server.port))
        .await
        .unwrap_err();
    assert!(
        matches!(err, PreprocessError::Fetch(FetchError::Timeout { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("image fetch timeout"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_urls_are_bounded_before_decoding() {
    let f = MediaFetcher::new(
        MediaUrlPolicy::default().with_max_data_url_bytes(1024),
        FetchLimits::default(),
    )
    .unwrap();
    assert_eq!(
        fetch(&f, "data:image/png;base64,aGVsbG8=").await.unwrap(),
        b"hello"
    );
    let big = format!("data:image/png;base64,{}", "A".repeat(4096));
    let err = fetch(&f, &big).await.unwrap_err();
    assert!(
        matches!(
            err,
            PreprocessError::Policy(PolicyError::DataUrlTooLarge { .. })
        ),
        "{err:?}"
    );
    let err = fetch(&f, "data:image/png;base64,%%%garbage%%%")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRequest);
    assert!(err.to_string().contains("not valid base64"), "{err}");
    let err = fetch(&f, "data:text/plain,hello").await.unwrap_err();
    assert!(
        matches!(
            err,
            PreprocessError::Policy(PolicyError::InvalidDataUrl { .. })
        ),
        "{err:?}"
    );
    // The audio cap (25 MiB) is below the data URL bound here: refused before decoding.
    let f = MediaFetcher::new(
        MediaUrlPolicy::default(),
        FetchLimits {
            max_audio_bytes: 1000,
            ..FetchLimits::default()
        },
    )
    .unwrap();
    let audio = format!("data:audio/wav;base64,{}", "A".repeat(4000));
    let err = f.fetch(&audio, Modality::Audio, &pool()).await.unwrap_err();
    assert!(
        matches!(err, PreprocessError::Fetch(FetchError::TooLarge { .. })),
        "{err:?}"
    );
    // A JPEG frame list gives one payload per frame.
    let got = f
        .fetch(
            "data:video/jpeg;base64,aGVsbG8=,d29ybGQ=",
            Modality::Video,
            &pool(),
        )
        .await
        .unwrap();
    match got.payload {
        Payload::JpegFrames(frames) => assert_eq!(frames.len(), 2),
        Payload::Bytes(_) => panic!("expected frames"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_urls_only_under_the_allowed_directory() {
    let dir = tempfile::tempdir().unwrap();
    let inside = dir.path().join("media");
    std::fs::create_dir(&inside).unwrap();
    std::fs::write(inside.join("a.png"), b"local").unwrap();
    std::fs::write(dir.path().join("secret.txt"), b"secret").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(dir.path().join("secret.txt"), inside.join("link.png")).unwrap();

    let url = |p: &Path| url::Url::from_file_path(p).unwrap().to_string();
    let f = fetcher(MediaUrlPolicy::default());
    let err = fetch(&f, &url(&inside.join("a.png"))).await.unwrap_err();
    assert!(
        matches!(
            err,
            PreprocessError::Policy(PolicyError::LocalMediaDisabled)
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), ErrorKind::BadRequest);

    let f = fetcher(MediaUrlPolicy::new(Some(&inside), None, false).unwrap());
    assert_eq!(
        fetch(&f, &url(&inside.join("a.png"))).await.unwrap(),
        b"local"
    );
    for escaped in [
        dir.path().join("secret.txt"),
        inside.join("..").join("secret.txt"),
        inside.join("link.png"),
        inside.join("missing.png"),
    ] {
        let err = fetch(&f, &url(&escaped)).await.unwrap_err();
        assert!(
            matches!(
                err,
                PreprocessError::Policy(PolicyError::LocalPathNotAllowed { .. })
            ),
            "{}: {err:?}",
            escaped.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetched_bytes_are_held_until_the_media_is_dropped_and_bound_the_server() {
    // Two 40 KiB answers (one with a length, one chunked) against a 64 KiB server budget
    // (one item's cap): the second waits for the first to be let go.
    let server = serve(|path| match path {
        "/sized" => Reply::Ok("image/png", vec![7u8; 40 * 1024]),
        "/chunked" => Reply::Chunked(40 * 1024),
        _ => Reply::Status(404),
    })
    .await;
    let limits = FetchLimits {
        max_bytes: 64 * 1024,
        max_audio_bytes: 64 * 1024,
        max_fetched_bytes: 0,
        ..FetchLimits::default()
    };
    let f = MediaFetcher::new(private_ok(), limits).unwrap();
    assert_eq!(
        f.fetched_bytes().capacity(),
        64 * 1024,
        "never under one item's cap"
    );
    let url = |p: &str| format!("http://127.0.0.1:{}{p}", server.port);
    for (first, second) in [("/sized", "/chunked"), ("/chunked", "/sized")] {
        let held = f
            .fetch(&url(first), Modality::Image, &pool())
            .await
            .unwrap();
        assert_eq!(held.payload.len(), 40 * 1024);
        assert!(
            held.held.bytes() >= 40 * 1024,
            "{first}: {}",
            held.held.bytes()
        );
        assert_eq!(f.fetched_bytes().in_use(), held.held.bytes());
        let err = f
            .fetch(&url(second), Modality::Image, &pool())
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                PreprocessError::MediaBusy {
                    stage: "downloading",
                    ..
                }
            ),
            "{first} then {second}: {err:?}"
        );
        assert_eq!(err.kind(), ErrorKind::Overloaded);
        drop(held);
        assert_eq!(f.fetched_bytes().in_use(), 0);
        let again = f
            .fetch(&url(second), Modality::Image, &pool())
            .await
            .unwrap();
        assert_eq!(again.payload.len(), 40 * 1024);
        drop(again);
        assert_eq!(
            f.fetched_bytes().in_use(),
            0,
            "a finished fetch holds nothing"
        );
    }
}
