//! The media URL parser and the policy's syntax checks on arbitrary input: no panic, and a
//! parsed data URL's payload is a suffix of the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use policies::{parse_media_url, MediaUrl, MediaUrlPolicy};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(MediaUrl::Data(d)) = parse_media_url(text) {
        assert!(text.ends_with(d.payload));
        let _ = d.decoded_len_upper_bound();
        let _ = d.payload_parts().count();
    }
    let policy = MediaUrlPolicy::default().with_max_data_url_bytes(1 << 16);
    let _ = policy.check_url(text);
});
