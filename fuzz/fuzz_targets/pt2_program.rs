//! Any bytes as the program JSON (`models/model.json`) of an otherwise valid archive: when
//! the bytes parse as JSON, every parameter, buffer and constant the signature names gets a
//! zero storage sized from its `tensor_values` entry (capped at 1 MiB), so mutations reach the
//! schema reader and the ATen lowering rather than stopping at a missing weight.
#![no_main]
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use std::io::Write;

fn numel(meta: &Value) -> u64 {
    meta.get("sizes")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|s| s.get("as_int").and_then(Value::as_u64).unwrap_or(1))
                .fold(1u64, |x, y| x.saturating_mul(y))
        })
        .unwrap_or(1)
}

fuzz_target!(|data: &[u8]| {
    let p = std::env::temp_dir().join(format!("rlx_fuzz_prog_{}.pt2", std::process::id()));
    let f = std::fs::File::create(&p).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let o = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored);
    let mut cfg = serde_json::Map::new();
    let mut storages: Vec<(String, Vec<u8>)> = vec![];
    if let Ok(v) = serde_json::from_slice::<Value>(data) {
        let gm = &v["graph_module"];
        let metas = &gm["graph"]["tensor_values"];
        if let Some(specs) = gm["signature"]["input_specs"].as_array() {
            for (i, s) in specs.iter().enumerate() {
                let Some((_, body)) = s.as_object().and_then(|o| o.iter().next()) else { continue };
                let Some(fqn) = ["parameter_name", "buffer_name", "tensor_constant_name"]
                    .iter()
                    .find_map(|k| body.get(*k).and_then(Value::as_str))
                else {
                    continue;
                };
                let arg = body["arg"]["name"].as_str().unwrap_or("");
                let meta = metas.get(arg).cloned().unwrap_or(json!({}));
                let bytes = (numel(&meta).saturating_mul(8)).min(1 << 20) as usize;
                let path = format!("weight_{i}");
                cfg.insert(
                    fqn.to_string(),
                    json!({"path_name": path, "is_param": true, "use_pickle": false, "tensor_meta": meta}),
                );
                storages.push((path, vec![0u8; bytes]));
            }
        }
    }
    let cfg = serde_json::to_vec(&json!({ "config": cfg })).unwrap();
    z.start_file("m/archive_format", o).unwrap();
    z.write_all(b"pt2").unwrap();
    z.start_file("m/models/model.json", o).unwrap();
    z.write_all(data).unwrap();
    z.start_file("m/data/weights/model_weights_config.json", o).unwrap();
    z.write_all(&cfg).unwrap();
    for (name, bytes) in storages {
        z.start_file(format!("m/data/weights/{name}"), o).unwrap();
        z.write_all(&bytes).unwrap();
    }
    z.finish().unwrap();
    if let Ok(m) = rlx_torch_import::Pt2Model::open(&p) {
        let _ = m.import(&rlx_onnx_import::ImportOptions::default());
    }
});
