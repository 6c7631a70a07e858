//! A checkpoint folder's processor files give the media spec the engine loads with the model.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use media::spec::{ImageProcessor, ModelMediaSpec, Qwen2VlConfig, SpecError, WhisperFeatureConfig};
use serde_json::json;

#[test]
fn model_dirs_give_their_processors() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    let vl = ModelMediaSpec::from_model_dir(&root.join("tiny-qwen2-vl")).unwrap();
    match &vl.image {
        Some(ImageProcessor::Qwen2Vl(c)) => {
            assert_eq!((c.min_pixels, c.max_pixels), (3136, 12_845_056));
            assert_eq!(
                (c.patch_size, c.merge_size, c.temporal_patch_size),
                (14, 2, 2)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(vl.video.is_some() && vl.audio.is_none());
    let audio = ModelMediaSpec::from_model_dir(&root.join("tiny-qwen2-audio")).unwrap();
    assert_eq!(audio.audio.as_ref().map(|a| a.n_mels), Some(128));
    assert!(audio.image.is_none() && audio.video.is_none());
    // A folder without processor files takes no media.
    assert_eq!(
        ModelMediaSpec::from_model_dir(&root).unwrap(),
        ModelMediaSpec::default()
    );
}

#[test]
fn invalid_processor_values_are_refused() {
    for bad in [
        json!({"patch_size": 0}),
        json!({"image_std": [1, 0, 1]}),
        json!({"image_mean": [0.5, 0.5]}),
        json!({"min_pixels": 10, "max_pixels": 5}),
        json!([1, 2]),
    ] {
        assert!(
            Qwen2VlConfig::from_preprocessor_config(&bad).is_err(),
            "{bad}"
        );
    }
    let ok = Qwen2VlConfig::from_preprocessor_config(
        &json!({"max_pixels": 50176, "image_mean": [0.5, 0.5, 0.5]}),
    )
    .unwrap();
    assert_eq!(ok.max_pixels, 50176);
    assert_eq!(ok.image_mean, [0.5; 3]);
}

#[test]
fn whisper_config_from_preprocessor_json() {
    let cfg = WhisperFeatureConfig::from_preprocessor_config(&json!({
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": 128, "sampling_rate": 16000, "n_fft": 400,
        "hop_length": 160, "chunk_length": 30, "padding_value": 0.0
    }))
    .unwrap();
    assert_eq!(cfg, WhisperFeatureConfig::whisper(128));
    assert_eq!(
        WhisperFeatureConfig::from_preprocessor_config(&json!({})).unwrap(),
        WhisperFeatureConfig::whisper(80)
    );
    for (key, bad) in [
        ("feature_size", json!(0)),
        ("feature_size", json!(100_000)),
        ("sampling_rate", json!(12)),
        ("n_fft", json!("400")),
        ("hop_length", json!(-1)),
        ("chunk_length", json!(100_000)),
    ] {
        let err = WhisperFeatureConfig::from_preprocessor_config(&json!({ key: bad })).unwrap_err();
        assert!(
            matches!(&err, SpecError::Audio { key: k, .. } if k == key),
            "{key}: {err}"
        );
    }
    // hop 1 at 384 kHz for 600 s would be a 100-billion-value tensor.
    let err = WhisperFeatureConfig::from_preprocessor_config(
        &json!({"hop_length": 1, "sampling_rate": 384000, "chunk_length": 600}),
    )
    .unwrap_err();
    assert!(matches!(err, SpecError::Audio { .. }));
    assert!(WhisperFeatureConfig::from_preprocessor_config(&json!([])).is_err());
}

#[test]
fn a_bad_processor_file_names_the_file() {
    let dir = tempdir();
    std::fs::write(
        dir.join("preprocessor_config.json"),
        r#"{"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 0}"#,
    )
    .unwrap();
    let err = ModelMediaSpec::from_model_dir(&dir).unwrap_err();
    assert_eq!(
        err.to_string(),
        "preprocessor_config.json: Invalid image processor setting patch_size: must be an \
         integer from 1 to 1024"
    );
    std::fs::write(dir.join("preprocessor_config.json"), "{").unwrap();
    let err = ModelMediaSpec::from_model_dir(&dir).unwrap_err();
    assert!(err.to_string().contains("invalid JSON"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A fresh folder under the target's temporary directory.
fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("media-spec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
