//! Bad `.pt2` archives: each gives one clear error naming the file and what is wrong, never
//! a panic or an allocation the size of a bogus header field. The archives are written here
//! (a one-node program: y = x * w), so the test needs no torch.

use rlx_onnx_import::ImportOptions;
use rlx_torch_import::{import_pt2, Pt2Model};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};

struct Tmp(PathBuf);
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
fn tmp(name: &str) -> Tmp {
    let p = std::env::temp_dir().join(format!("rlx_pt2_{}_{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    Tmp(p)
}

fn meta(sizes: &[i64]) -> serde_json::Value {
    let mut strides = vec![1i64; sizes.len()];
    for i in (0..sizes.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * sizes[i + 1];
    }
    json!({"dtype": 7, "sizes": sizes.iter().map(|s| json!({"as_int": s})).collect::<Vec<_>>(),
           "strides": strides.iter().map(|s| json!({"as_int": s})).collect::<Vec<_>>(),
           "storage_offset": {"as_int": 0}, "requires_grad": false,
           "device": {"type": "cpu", "index": null}, "layout": 7})
}

/// A valid program `y = x * w` (x: f32[2, 3], w: f32[3]) with `w_sizes` declared for the
/// weight, `w_bytes` stored for it, and `schema_major`.
fn program(schema_major: i64, w_sizes: &[i64]) -> serde_json::Value {
    json!({
        "schema_version": {"major": schema_major, "minor": 20},
        "torch_version": "2.15.0",
        "graph_module": {
            "graph": {
                "inputs": [{"as_tensor": {"name": "p_w"}}, {"as_tensor": {"name": "x"}}],
                "outputs": [{"as_tensor": {"name": "mul"}}],
                "nodes": [{
                    "target": "torch.ops.aten.mul.Tensor", "name": "mul",
                    "inputs": [{"name": "self", "arg": {"as_tensor": {"name": "x"}}, "kind": 1},
                               {"name": "other", "arg": {"as_tensor": {"name": "p_w"}}, "kind": 1}],
                    "outputs": [{"as_tensor": {"name": "mul"}}],
                    "metadata": {"stack_trace": "File \"/home/u/net.py\", line 7, in forward\n    return x * self.w",
                                 "nn_module_stack": "L__self__,,net.Net"}
                }],
                "tensor_values": {"p_w": meta(w_sizes), "x": meta(&[2, 3]), "mul": meta(&[2, 3])},
                "sym_int_values": {}
            },
            "signature": {
                "input_specs": [{"parameter": {"arg": {"name": "p_w"}, "parameter_name": "w"}},
                                {"user_input": {"arg": {"as_tensor": {"name": "x"}}}}],
                "output_specs": [{"user_output": {"arg": {"as_tensor": {"name": "mul"}}}}]
            }
        }
    })
}

fn write_archive(path: &Path, entries: &[(&str, Vec<u8>)]) {
    let f = std::fs::File::create(path).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let o =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in entries {
        z.start_file(*name, o).unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();
}

fn archive(
    path: &Path,
    prog: serde_json::Value,
    w_sizes: &[i64],
    w_bytes: Vec<u8>,
    extra: Option<(&str, Vec<u8>)>,
) {
    let cfg = json!({"config": {"w": {"path_name": "weight_0", "is_param": true, "use_pickle": false, "tensor_meta": meta(w_sizes)}}});
    let mut e: Vec<(&str, Vec<u8>)> = vec![
        ("m/archive_format", b"pt2".to_vec()),
        ("m/archive_version", b"0".to_vec()),
        ("m/byteorder", b"little".to_vec()),
        ("m/models/model.json", serde_json::to_vec(&prog).unwrap()),
        (
            "m/data/weights/model_weights_config.json",
            serde_json::to_vec(&cfg).unwrap(),
        ),
        ("m/data/weights/weight_0", w_bytes),
    ];
    if let Some(x) = extra {
        e.push(x);
    }
    write_archive(path, &e);
}

fn w3() -> Vec<u8> {
    [1.0f32, 2.0, 3.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

fn err_of(path: &Path) -> String {
    match Pt2Model::open(path) {
        Ok(m) => match m.import(&ImportOptions::default()) {
            Ok(_) => panic!("{} imported", path.display()),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_valid_archive_imports_with_provenance() {
    let t = tmp("valid");
    let p = t.0.join("ok.pt2");
    archive(&p, program(8, &[3]), &[3], w3(), None);
    let g = import_pt2(&p, &ImportOptions::default()).unwrap();
    let mul = g
        .nodes
        .iter()
        .find(|n| matches!(n.op, rlx_ir::Op::Binary(rlx_ir::BinaryOp::Mul)))
        .unwrap();
    let o = mul.origin.as_ref().unwrap();
    assert_eq!(o.label, "mul");
    assert_eq!(o.op_type.as_deref(), Some("aten.mul.Tensor"));
    let src = o.source.as_ref().unwrap();
    assert_eq!(
        (src.file.as_str(), src.line, src.code.as_deref()),
        ("/home/u/net.py", 7, Some("return x * self.w"))
    );
    assert_eq!(g.input_decls[0].0, "x");
}

#[test]
fn truncated_archive() {
    let t = tmp("trunc");
    let p = t.0.join("ok.pt2");
    archive(&p, program(8, &[3]), &[3], w3(), None);
    let b = std::fs::read(&p).unwrap();
    let q = t.0.join("trunc.pt2");
    std::fs::write(&q, &b[..b.len() / 2]).unwrap();
    let e = err_of(&q);
    assert!(e.contains("trunc.pt2") && e.contains("zip"), "{e}");
}

#[test]
fn weights_shorter_than_declared_storage() {
    let t = tmp("short");
    let p = t.0.join("short.pt2");
    archive(&p, program(8, &[3]), &[3], w3()[..8].to_vec(), None);
    let e = err_of(&p);
    assert!(
        e.contains("short.pt2") && e.contains("tensor \"w\"") && e.contains("holds 8 bytes"),
        "{e}"
    );
}

#[test]
fn entry_escaping_the_archive() {
    let t = tmp("escape");
    let p = t.0.join("escape.pt2");
    archive(
        &p,
        program(8, &[3]),
        &[3],
        w3(),
        Some(("m/../../etc/passwd", b"x".to_vec())),
    );
    let e = err_of(&p);
    assert!(
        e.contains("escape.pt2") && e.contains("leaves the archive"),
        "{e}"
    );
}

#[test]
fn unknown_schema_version() {
    let t = tmp("schema");
    let p = t.0.join("v9.pt2");
    archive(&p, program(9, &[3]), &[3], w3(), None);
    let e = err_of(&p);
    assert!(
        e.contains("v9.pt2") && e.contains("schema version 9.20") && e.contains("torch 2.15.0"),
        "{e}"
    );
}

#[test]
fn a_trillion_element_tensor_is_refused_before_allocation() {
    let t = tmp("huge");
    let p = t.0.join("huge.pt2");
    archive(
        &p,
        program(8, &[1_000_000, 1_000_000]),
        &[1_000_000, 1_000_000],
        w3(),
        None,
    );
    let e = err_of(&p);
    assert!(
        e.contains("huge.pt2")
            && e.contains("tensor \"w\"")
            && e.contains("1000000000000 elements"),
        "{e}"
    );
}

#[test]
fn unsupported_op_names_the_op_node_and_line() {
    let t = tmp("unsup");
    let p = t.0.join("unsup.pt2");
    let mut prog = program(8, &[3]);
    prog["graph_module"]["graph"]["nodes"][0]["target"] =
        json!("torch.ops.aten.special_bessel_j0.default");
    archive(&p, prog, &[3], w3(), None);
    let e = err_of(&p);
    assert!(
        e.contains("aten.special_bessel_j0.default")
            && e.contains("FX node \"mul\"")
            && e.contains("net.py:7  return x * self.w"),
        "{e}"
    );
}

#[test]
fn not_a_zip_and_not_a_pt2() {
    let t = tmp("notzip");
    let p = t.0.join("x.pt2");
    std::fs::write(&p, b"hello").unwrap();
    assert!(err_of(&p).contains("not a readable zip"), "{}", err_of(&p));
    let q = t.0.join("y.pt2");
    write_archive(&q, &[("a/b.txt", b"x".to_vec())]);
    assert!(
        err_of(&q).contains("not a .pt2 written by torch.export.save"),
        "{}",
        err_of(&q)
    );
}

// ------------------------------------------------ torch.export's older layouts (torch 2.6-2.8)

/// A `torch.save` zip of `{"w": tensor(storage "0", offset 0, sizes (3,), strides (1,))}`,
/// pickled as torch.save writes it (protocol 2); `global` replaces the rebuild function.
fn torch_save(global: &str, storage: Vec<u8>) -> Vec<u8> {
    let s = |t: &str| {
        let mut v = vec![b'X'];
        v.extend_from_slice(&(t.len() as u32).to_le_bytes());
        v.extend_from_slice(t.as_bytes());
        v
    };
    let mut p = b"\x80\x02}(".to_vec();
    p.extend(s("w"));
    p.extend_from_slice(format!("c{global}\n").as_bytes());
    p.extend_from_slice(b"((");
    p.extend(s("storage"));
    p.extend_from_slice(b"ctorch\nFloatStorage\n");
    p.extend(s("0"));
    p.extend(s("cpu"));
    p.extend_from_slice(b"K\x03tQK\x00K\x03\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtRu.");
    let mut out = std::io::Cursor::new(vec![]);
    let mut z = zip::ZipWriter::new(&mut out);
    let o =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in [
        ("archive/data.pkl", p),
        ("archive/byteorder", b"little".to_vec()),
        ("archive/data/0", storage),
    ] {
        z.start_file(name, o).unwrap();
        z.write_all(&bytes).unwrap();
    }
    z.finish().unwrap();
    out.into_inner()
}

const REBUILD: &str = "torch._utils\n_rebuild_tensor_v2";

/// torch 2.6's flat layout: `version`, `serialized_exported_program.json`,
/// `serialized_state_dict.pt`, `serialized_constants.pt` (empty: no constants).
fn flat(path: &Path, version: &str, state: Vec<u8>) {
    write_archive(
        path,
        &[
            (
                "serialized_exported_program.json",
                serde_json::to_vec(&program(8, &[3])).unwrap(),
            ),
            ("serialized_state_dict.pt", state),
            ("serialized_constants.pt", vec![]),
            ("version", version.as_bytes().to_vec()),
        ],
    );
}

fn weight_of(path: &Path) -> Vec<f32> {
    let g = import_pt2(path, &ImportOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let w = g
        .nodes
        .iter()
        .find_map(|n| match &n.op {
            rlx_ir::Op::Constant(t) if t.numel() == 3 => Some(t.clone()),
            _ => None,
        })
        .expect("the weight is a constant of 3 elements");
    (0..3).map(|i| w.data().get_f64(i) as f32).collect()
}

#[test]
fn torch_2_6_flat_archive_imports() {
    let t = tmp("flat");
    let p = t.0.join("flat.pt2");
    flat(&p, "8.2", torch_save(REBUILD, w3()));
    assert_eq!(weight_of(&p), [1.0, 2.0, 3.0]);
}

#[test]
fn torch_2_8_pickled_weights_import() {
    let t = tmp("pickled");
    let p = t.0.join("pickled.pt2");
    write_archive(
        &p,
        &[
            ("model/archive_format", b"pt2".to_vec()),
            ("model/archive_version", b"0".to_vec()),
            ("model/byteorder", b"little".to_vec()),
            (
                "model/models/model.json",
                serde_json::to_vec(&program(8, &[3])).unwrap(),
            ),
            ("model/data/weights/model.pt", torch_save(REBUILD, w3())),
        ],
    );
    assert_eq!(weight_of(&p), [1.0, 2.0, 3.0]);
}

#[test]
fn flat_archive_of_another_version_names_it() {
    let t = tmp("flatv");
    let p = t.0.join("old.pt2");
    flat(&p, "5.1", torch_save(REBUILD, w3()));
    let e = err_of(&p);
    assert!(
        e.contains("old.pt2") && e.contains("version \"5.1\"") && e.contains("schema 8.x"),
        "{e}"
    );
}

#[test]
fn unknown_archive_version_is_named() {
    let t = tmp("archv");
    let p = t.0.join("av.pt2");
    let mut e: Vec<(&str, Vec<u8>)> = vec![
        ("m/archive_format", b"pt2".to_vec()),
        ("m/archive_version", b"7".to_vec()),
        (
            "m/models/model.json",
            serde_json::to_vec(&program(8, &[3])).unwrap(),
        ),
    ];
    e.push(("m/data/weights/weight_0", w3()));
    write_archive(&p, &e);
    let e = err_of(&p);
    assert!(
        e.contains("av.pt2") && e.contains("archive_version \"7\""),
        "{e}"
    );
}

#[test]
fn pickled_weights_with_a_foreign_global_are_refused() {
    let t = tmp("evil");
    let p = t.0.join("evil.pt2");
    flat(&p, "8.2", torch_save("os\nsystem", w3()));
    let e = err_of(&p);
    assert!(
        e.contains("evil.pt2") && e.contains("serialized_state_dict.pt") && e.contains("os.system"),
        "{e}"
    );
}

#[test]
fn pickled_storage_shorter_than_the_view() {
    let t = tmp("pshort");
    let p = t.0.join("pshort.pt2");
    flat(&p, "8.2", torch_save(REBUILD, w3()[..8].to_vec()));
    let e = err_of(&p);
    assert!(
        e.contains("pshort.pt2") && e.contains("tensor \"w\"") && e.contains("holds 8 bytes"),
        "{e}"
    );
}

#[test]
fn truncated_pickled_state_dict() {
    let t = tmp("ptrunc");
    let p = t.0.join("ptrunc.pt2");
    let s = torch_save(REBUILD, w3());
    flat(&p, "8.2", s[..s.len() / 2].to_vec());
    let e = err_of(&p);
    assert!(
        e.contains("ptrunc.pt2") && e.contains("serialized_state_dict.pt"),
        "{e}"
    );
}

/// An archive re-zipped with deflate (`zip -9`) whose weights are all zeros compresses far
/// more than 64:1; it still imports, with the weights intact.
#[test]
fn deflated_archive_of_zero_weights_imports() {
    let t = tmp("deflated");
    let p = t.0.join("ok.pt2");
    let n = 1i64 << 18; // 1 MiB of zeros
    let mut prog = program(8, &[n]);
    prog["graph_module"]["graph"]["tensor_values"]["x"] = meta(&[2, n]);
    prog["graph_module"]["graph"]["tensor_values"]["mul"] = meta(&[2, n]);
    archive(&p, prog, &[n], vec![0u8; 4 * n as usize], None);
    // Re-zip every entry with deflate.
    let mut src = zip::ZipArchive::new(std::fs::File::open(&p).unwrap()).unwrap();
    let q = t.0.join("deflated.pt2");
    let mut z = zip::ZipWriter::new(std::fs::File::create(&q).unwrap());
    let o = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for i in 0..src.len() {
        let mut e = src.by_index(i).unwrap();
        let mut b = vec![];
        std::io::Read::read_to_end(&mut e, &mut b).unwrap();
        z.start_file(e.name().to_string(), o).unwrap();
        z.write_all(&b).unwrap();
    }
    z.finish().unwrap();
    let size = std::fs::metadata(&q).unwrap().len();
    assert!(
        size * 64 < 4 * n as u64,
        "the test needs a ratio over 64:1 (archive {size} bytes)"
    );
    let g = import_pt2(&q, &ImportOptions::default()).unwrap();
    assert!(!g.nodes.is_empty());
}

/// Weights that contradict the program's graph (another dtype, another shape) are refused,
/// naming the tensor, both types and the placeholder: the graph would run on wrong data.
#[test]
fn weights_contradicting_the_graph_are_refused() {
    let t = tmp("contradict");
    // The graph uses w as f32[3]; the archive stores it as f32[2] (shape) ...
    let p = t.0.join("shape.pt2");
    let mut prog = program(8, &[3]);
    archive(&p, prog.clone(), &[2], w3(), None);
    let e = err_of(&p);
    assert!(
        e.contains("tensor \"w\"")
            && e.contains("[2]")
            && e.contains("p_w")
            && e.contains("do not belong"),
        "{e}"
    );
    // ... and as float16 (dtype), with the same shape.
    prog["graph_module"]["graph"]["tensor_values"]["p_w"]["dtype"] = json!(6);
    let q = t.0.join("dtype.pt2");
    archive(&q, prog, &[3], w3(), None);
    let e = err_of(&q);
    assert!(
        e.contains("tensor \"w\"") && e.contains("float32") && e.contains("float16"),
        "{e}"
    );
}
