//! Any bytes as the program JSON (`models/model.json`) of an otherwise valid archive with one
//! 3-element f32 weight: reaches the schema reader and the ATen lowering.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    let p = std::env::temp_dir().join(format!("rlx_fuzz_prog_{}.pt2", std::process::id()));
    let f = std::fs::File::create(&p).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let o = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored);
    let cfg = br#"{"config": {"w": {"path_name": "weight_0", "is_param": true, "use_pickle": false, "tensor_meta": {"dtype": 7, "sizes": [{"as_int": 3}], "strides": [{"as_int": 1}], "storage_offset": {"as_int": 0}}}}}"#;
    for (name, bytes) in [
        ("m/archive_format", &b"pt2"[..]),
        ("m/models/model.json", data),
        ("m/data/weights/model_weights_config.json", &cfg[..]),
        ("m/data/weights/weight_0", &[0u8; 12][..]),
    ] {
        z.start_file(name, o).unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();
    if let Ok(m) = rlx_torch_import::Pt2Model::open(&p) {
        let _ = m.import(&rlx_onnx_import::ImportOptions::default());
    }
});
