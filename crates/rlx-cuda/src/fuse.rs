//! Elementwise fusion: chains and trees of f32 Unary/Activation/Binary nodes of one output
//! size, whose inner values have no other reader, run as one generated kernel that reads the
//! group's external inputs once and writes only the group's last value.
//!
//! A fused run computes every element with the same float operations in the same order as the
//! unfused kernels (NVRTC without FMA contraction), so its outputs are bit-identical. The inner
//! values are not materialized: a scanning run (`RLX_DEBUG_NANS`) counts their NaN/Inf inside
//! the kernel; runs that need the values themselves (`run_all` for divergence replay and the
//! printer, launch-blocking) use the unfused steps.

use crate::kernels;
use rlx_ir::{Graph, NodeId, Op};

/// Groups of at least two nodes (members in topological order, the last one the group's
/// output), from the nodes `eligible` marks (elementwise f32 ops on the GPU). A node joins the
/// group of an input when that input is the group's last member, has no other reader and is
/// not a graph output, and has the node's dims.
pub(crate) fn plan_groups(g: &Graph, eligible: &[bool]) -> Vec<Vec<NodeId>> {
    let uses = g.use_counts();
    let mut group_of: Vec<Option<usize>> = vec![None; g.len()];
    let mut groups: Vec<Vec<NodeId>> = vec![];
    for node in &g.nodes {
        let k = node.id.index();
        if !eligible[k] {
            continue;
        }
        let mut joined: Vec<usize> = vec![];
        for &i in &node.inputs {
            let Some(gi) = group_of[i.index()] else {
                continue;
            };
            let sink = *groups[gi].last().expect("groups are never empty");
            if sink == i
                && uses[i.index()] == 1
                && g.node(i).shape.dims_usize() == node.shape.dims_usize()
                && !joined.contains(&gi)
            {
                joined.push(gi);
            }
        }
        let gi = match joined.split_first() {
            None => {
                groups.push(vec![]);
                groups.len() - 1
            }
            Some((&first, rest)) => {
                for &o in rest {
                    let moved = std::mem::take(&mut groups[o]);
                    for m in &moved {
                        group_of[m.index()] = Some(first);
                    }
                    groups[first].extend(moved);
                }
                // Keep topological order (groups merged here are disjoint and each ordered).
                groups[first].sort();
                first
            }
        };
        groups[gi].push(node.id);
        group_of[k] = Some(gi);
    }
    groups.into_iter().filter(|m| m.len() >= 2).collect()
}

/// The inputs a group reads from outside (first use order).
pub(crate) fn external_inputs(g: &Graph, members: &[NodeId]) -> Vec<NodeId> {
    let mut ext = vec![];
    for &m in members {
        for &i in &g.node(m).inputs {
            if !members.contains(&i) && !ext.contains(&i) {
                ext.push(i);
            }
        }
    }
    ext
}

/// Name kernel sources written with the placeholder `FZ_NAME` (see [`kernel_source`]): equal
/// sources share one kernel. Returns the program text (distinct kernels named `fz_<k>`) and
/// each source's kernel number `k`.
pub(crate) fn dedupe(sources: &[String]) -> (String, Vec<usize>) {
    let mut distinct: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut src = String::new();
    let mut kernel_of = Vec::with_capacity(sources.len());
    for k in sources {
        let next = distinct.len();
        let id = *distinct.entry(k.as_str()).or_insert_with(|| {
            src += &k.replace("FZ_NAME", &format!("fz_{next}"));
            next
        });
        kernel_of.push(id);
    }
    (src, kernel_of)
}

fn lit(x: f32) -> String {
    format!("__int_as_float(0x{:08x})", x.to_bits())
}

/// CUDA source of kernel `name(float* o, u64 n, const i64* meta, u64* cnt)` for a group, where
/// `meta` = [address of each external input, then the broadcast metadata of
/// [`crate::executor`]'s `bcast_meta` over the group's dims] (the kernel reads the addresses;
/// its broadcast index math has the same merged dims and strides compiled in as literals).
/// Element counts below 2^31 (32-bit index math). `full[e]` says external input `e` has the group's dims (read at `i`,
/// no index math). With `cnt` non-null (a scanning run), the NaN/±inf counts and first indices
/// of every member but the last (whose value is written and scanned like any other) go to
/// `cnt[6 j ..]` for the j-th member, as `nan_scan` writes them.
pub(crate) fn kernel_source(
    g: &Graph,
    members: &[NodeId],
    ext: &[NodeId],
    full: &[bool],
    name: &str,
) -> Result<String, String> {
    Ok(variant(g, members, ext, full, name, false)?
        + &variant(g, members, ext, full, &format!("{name}_scan"), true)?
        + &count_kernel(g, members, ext, full, &format!("{name}_cnt"))?)
}

/// Positions in `ext` of the external inputs a group's scanning kernels count besides its
/// inner members: those of the group's dims (read whole, element `i` at `i`) and of a float
/// dtype. The counted values are, in slot order: the inner members, these inputs, the group's
/// last member (its stored value); then one flag word. A scanning run takes an input's or the
/// last member's counts from here instead of `nan_scan` when the executor can (see
/// `CudaExecutor::plan_scan`): counting a value in the kernel that reads or writes it saves
/// reading it again.
pub(crate) fn extra_counted(g: &Graph, ext: &[NodeId], full: &[bool]) -> Vec<usize> {
    (0..ext.len())
        .filter(|&e| {
            full[e]
                && matches!(
                    g.node(ext[e]).shape.dtype,
                    rlx_ir::DType::F32 | rlx_ir::DType::F16 | rlx_ir::DType::BF16
                )
        })
        .collect()
}

/// The expressions a group's scanning kernels count, in slot order (see [`extra_counted`]).
fn counted_values(g: &Graph, members: &[NodeId], ext: &[NodeId], full: &[bool]) -> Vec<String> {
    let k = members.len().saturating_sub(1);
    let mut v: Vec<String> = (0..k).map(|p| format!("t{p}")).collect();
    v.extend(extra_counted(g, ext, full).iter().map(|e| format!("v{e}")));
    v.push(format!("t{k}"));
    v
}

/// One kernel of [`kernel_source`]: `scan` adds the members' NaN/Inf counting (a separate
/// kernel, so ordinary runs carry none of its registers or branches).
fn variant(
    g: &Graph,
    members: &[NodeId],
    ext: &[NodeId],
    full: &[bool],
    name: &str,
    scan: bool,
) -> Result<String, String> {
    let counted = if scan {
        counted_values(g, members, ext, full)
    } else {
        vec![]
    };
    let (mut s, body) = head_and_body(g, members, ext, full, name)?;
    let lp = LOOP;
    // Scanning: the loop keeps one flag (some inner value of this thread's elements is NaN or
    // ±inf); a warp with a flagged lane sets the group's flag word (`cnt[6 k]`, k = inner
    // values), and the separate `_cnt` kernel, launched after this one, recounts only when it
    // is set. Counters in this kernel, even on a path never taken, would raise its register
    // count and lower its occupancy on every clean run (ResNet-50's fused kernels ran at half
    // speed with them).
    if !counted.is_empty() {
        s += "  bool bad = false;\n";
    }
    s += lp;
    s += &body;
    if !counted.is_empty() {
        let flags: Vec<String> = counted.iter().map(|v| format!("rlx_nf({v})")).collect();
        s += &format!("    bad |= {};\n", flags.join(" | "));
    }
    s += &format!("    rlx_put(o[i], t{});\n  }}\n", members.len() - 1);
    if !counted.is_empty() {
        s += &format!(
            "  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31u) == 0u) atomicOr(cnt + {}, 1ull);\n",
            6 * counted.len()
        );
    }
    s += "}\n";
    Ok(s)
}

const LOOP: &str = "  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {\n";

/// The counting kernel of a group's scanning run: returns at once unless the `_scan` kernel
/// set the group's flag word; then recomputes every element (the same operations, so the
/// same values) and counts each inner value's NaN/±inf and first indices into `cnt[6 j ..]`.
fn count_kernel(
    g: &Graph,
    members: &[NodeId],
    ext: &[NodeId],
    full: &[bool],
    name: &str,
) -> Result<String, String> {
    let counted = counted_values(g, members, ext, full);
    let (head, body) = head_and_body(g, members, ext, full, name)?;
    let mut s = head.replacen(
        "{\n",
        &format!("{{\n  if (cnt[{}] == 0ull) return;\n", 6 * counted.len()),
        1,
    );
    for j in 0..counted.len() {
        s += &format!("  RlxCnt c{j}; rlx_cnt_init(c{j});\n");
    }
    s += LOOP;
    s += &body;
    for (j, v) in counted.iter().enumerate() {
        s += &format!("    rlx_scan1(__float_as_uint({v}), i, c{j});\n");
    }
    s += "  }\n";
    for j in 0..counted.len() {
        s += &format!("  rlx_flush(c{j}, cnt + {});\n", 6 * j);
    }
    s += "}\n";
    Ok(s)
}

/// A fused kernel's signature and pointer setup, and its loop body (broadcast indices, the
/// external loads, one value `t<k>` per member).
fn head_and_body(
    g: &Graph,
    members: &[NodeId],
    ext: &[NodeId],
    full: &[bool],
    name: &str,
) -> Result<(String, String), String> {
    let ne = ext.len();
    // Storage types: bfloat16 values are 16-bit `rlx_bf` (loaded with `rlx_f`, stored with
    // `rlx_put`, which rounds once; the members' values are already rounded, so it is exact).
    let sty = |id: NodeId| match g.node(id).shape.dtype {
        rlx_ir::DType::BF16 => "rlx_bf",
        _ => "float",
    };
    let oty = sty(*members.last().ok_or("an empty group")?);
    let mut s = format!(
        "extern \"C\" __global__ void {name}({oty}* __restrict__ o, u64 n, const i64* __restrict__ meta, u64* __restrict__ cnt) {{\n"
    );
    for (e, &x) in ext.iter().enumerate() {
        let t = sty(x);
        s += &format!("  const {t}* __restrict__ x{e} = (const {t}*)meta[{e}];\n");
    }
    s += &format!("  const i64* bm = meta + {ne};\n  (void)bm;\n");
    // The loop body: broadcast indices, the external loads, then one value per member.
    let mut body = String::new();
    let bcast: Vec<usize> = (0..ne).filter(|&e| !full[e]).collect();
    if !bcast.is_empty() {
        // The group's merged broadcast dims and strides as literals (the same `bcast_meta`
        // the executor passes in `meta`): divisions by constants compile to multiply-high,
        // and no thread reads index metadata from memory. Groups of other dims get their
        // own kernel; identical layers still share one.
        let od = g
            .node(*members.last().ok_or("an empty group")?)
            .shape
            .dims_usize()
            .to_vec();
        let dims: Vec<Vec<usize>> = ext
            .iter()
            .map(|&e| g.node(e).shape.dims_usize().to_vec())
            .collect();
        let refs: Vec<&[usize]> = dims.iter().map(|d| d.as_slice()).collect();
        let bm = crate::executor::bcast_meta(&refs, &od);
        let r = bm[0] as usize;
        let dim = |d: usize| bm[1 + d] as u64;
        let stride = |e: usize, d: usize| bm[1 + r * (e + 1) + d] as u64;
        body += "    unsigned rem = (unsigned)i;\n";
        // Coordinates `q<d>` (the counting kernel's counters are `c<j>`), only those some
        // broadcast input's index uses.
        let used = |d: usize| bcast.iter().any(|&e| stride(e, d) != 0);
        for d in (1..r).rev() {
            if used(d) {
                body += &format!("    const unsigned q{d} = rem % {}u;\n", dim(d));
            }
            body += &format!("    rem /= {}u;\n", dim(d));
        }
        if used(0) {
            body += "    const unsigned q0 = rem;\n";
        }
        for &e in &bcast {
            let terms: Vec<String> = (0..r)
                .filter(|&d| stride(e, d) != 0)
                .map(|d| format!("q{d} * {}u", stride(e, d)))
                .collect();
            let sum = if terms.is_empty() {
                "0u".to_string()
            } else {
                terms.join(" + ")
            };
            body += &format!("    const unsigned j{e} = {sum};\n");
        }
    }
    for (e, &f) in full.iter().enumerate().take(ne) {
        let at = if f { "i".to_string() } else { format!("j{e}") };
        body += &format!("    float v{e} = rlx_f(x{e}[{at}]);\n");
    }
    let var = |id: NodeId| -> String {
        match ext.iter().position(|&x| x == id) {
            Some(e) => format!("v{e}"),
            // By position in the group, so identical groups (one per layer) give one source.
            None => format!(
                "t{}",
                members.iter().position(|&m| m == id).expect("a member")
            ),
        }
    };
    for &m in members {
        let node = g.node(m);
        let expr = match &node.op {
            Op::Binary(b) => {
                let k = kernels::binary_kernel(*b)
                    .ok_or_else(|| format!("{m}: no kernel for {b:?}"))?;
                let f = k.strip_prefix("b_").unwrap_or(&k);
                format!("g_{f}({}, {})", var(node.inputs[0]), var(node.inputs[1]))
            }
            op => {
                let (k, p) = kernels::unary_kernel(op)
                    .ok_or_else(|| format!("{m}: no kernel for {}", op.name()))?;
                let f = k.strip_prefix("u_").unwrap_or(&k);
                // bfloat16 members: the `fb_` form (f32 math where f32 kernels use double).
                let pre = if node.shape.dtype == rlx_ir::DType::BF16 {
                    "fb"
                } else {
                    "f"
                };
                format!(
                    "{pre}_{f}({}, {}, {})",
                    var(node.inputs[0]),
                    lit(p[0]),
                    lit(p[1])
                )
            }
        };
        // A float16/bfloat16 member rounds its value to its dtype, as the unfused node's
        // in-place rounding does (same function), so fused and unfused runs stay bit-identical.
        let expr = match node.shape.dtype {
            rlx_ir::DType::BF16 => format!("rlx_rbf16({expr})"),
            rlx_ir::DType::F16 => format!("rlx_rf16({expr})"),
            _ => expr,
        };
        let pos = members.iter().position(|&x| x == m).expect("a member");
        body += &format!("    float t{pos} = {expr};\n");
    }
    Ok((s, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{Activation, DType, Shape, UnaryOp};

    fn sh(d: &[usize]) -> Shape {
        Shape::new(d, DType::F32)
    }

    /// Two layers' identical chains give one kernel; a different chain its own.
    #[test]
    fn identical_groups_share_a_kernel() {
        let mut g = Graph::new("layers");
        let s = sh(&[2, 8]);
        let mut srcs = vec![];
        let mut x = g.input("x", s.clone());
        for layer in 0..3 {
            let e = g.unary(UnaryOp::Exp, x, s.clone());
            let op = if layer == 2 {
                UnaryOp::Sqrt
            } else {
                UnaryOp::Neg
            };
            let n = g.unary(op, e, s.clone());
            let ext = external_inputs(&g, &[e, n]);
            srcs.push(kernel_source(&g, &[e, n], &ext, &[true], "FZ_NAME").unwrap());
            x = g.unary(UnaryOp::Abs, n, s.clone());
        }
        let (src, kernel_of) = dedupe(&srcs);
        assert_eq!(kernel_of, vec![0, 0, 1]);
        assert!(
            src.contains("void fz_0(") && src.contains("void fz_0_scan("),
            "{src}"
        );
        assert!(src.contains("void fz_1(") && !src.contains("fz_2"), "{src}");
        assert!(!src.contains("FZ_NAME"), "{src}");
        // The plain kernel keeps no flag; the scanning one flags the inner value (Exp) in its
        // loop and counts it only in a warp that saw a non-finite value.
        let plain = &src[src.find("void fz_0(").unwrap()..src.find("void fz_0_scan(").unwrap()];
        assert!(
            !plain.contains("bad") && !plain.contains("RlxCnt"),
            "{plain}"
        );
        let scan = &src[src.find("void fz_0_scan(").unwrap()..];
        let scan = &scan[..scan.find("void fz_0_cnt(").unwrap()];
        // Counted: the inner Exp, the full input x, the group's value; the flag after them.
        assert!(
            scan.contains("bad |= rlx_nf(t0) | rlx_nf(v0) | rlx_nf(t1);"),
            "{scan}"
        );
        assert!(scan.contains("atomicOr(cnt + 18, 1ull)"), "{scan}");
        assert!(
            !scan.contains("RlxCnt"),
            "no counters in the fast kernel: {scan}"
        );
        let cnt = &src[src.find("void fz_0_cnt(").unwrap()..];
        let cnt = &cnt[..cnt.find("void fz_1").unwrap_or(cnt.len())];
        assert!(cnt.contains("if (cnt[18] == 0ull) return;"), "{cnt}");
        assert!(
            cnt.contains("rlx_scan1(__float_as_uint(t0), i, c0)"),
            "{cnt}"
        );
        assert!(
            cnt.contains("rlx_scan1(__float_as_uint(v0), i, c1)")
                && cnt.contains("rlx_scan1(__float_as_uint(t1), i, c2)"),
            "the input and the group's value are counted here: {cnt}"
        );
        assert!(
            !cnt.contains("rlx_put(o[i]"),
            "the counting kernel writes no value: {cnt}"
        );
    }

    #[test]
    fn groups_follow_single_use_chains_of_one_size() {
        let mut g = Graph::new("fuse");
        let x = g.input("x", sh(&[4, 8]));
        let b = g.input("b", sh(&[8]));
        let a = g.add(x, b, sh(&[4, 8])); // 2
        let e = g.unary(UnaryOp::Exp, a, sh(&[4, 8])); // 3
        let r = g.activation(Activation::Relu, e, sh(&[4, 8])); // 4: e has one use
        let n = g.unary(UnaryOp::Neg, x, sh(&[4, 8])); // 5: a new group
        let m = g.mul(r, n, sh(&[4, 8])); // 6: joins both groups
        let s = g.unary(UnaryOp::Sqrt, m, sh(&[4, 8])); // 7
        let t = g.unary(UnaryOp::Abs, s, sh(&[4, 8])); // 8: s is an output too: not joined
        g.set_outputs(vec![s, t]);
        let eligible: Vec<bool> = g.nodes.iter().map(|n| !n.op.is_leaf()).collect();
        let groups = plan_groups(&g, &eligible);
        assert_eq!(groups, vec![vec![a, e, r, n, m, s]]);
        let ext = external_inputs(&g, &groups[0]);
        assert_eq!(ext, vec![x, b]);
        let src = kernel_source(&g, &groups[0], &ext, &[true, false], "fz_0").unwrap();
        assert!(src.contains("float v1 = rlx_f(x1[j1]);"), "{src}");
        // Broadcast index math with the dims as literals (no metadata reads per element).
        assert!(src.contains("const unsigned q1 = rem % 8u;"), "{src}");
        assert!(src.contains("const unsigned j1 = q1 * 1u;"), "{src}");
        assert!(!src.contains("bm[1"), "{src}");
        assert!(src.contains("g_add(v0, v1)"), "{src}");
        assert!(src.contains("float t5 = f_sqrt(t4"), "{src}");
        assert!(src.contains("rlx_put(o[i], t5);"), "{src}");
        // Every member but the last is counted in a scanning run (slot j = position).
        assert!(
            src.contains("rlx_scan1(__float_as_uint(t0), i, c0)"),
            "{src}"
        );
        assert!(src.contains("rlx_flush(c4, cnt + 24)"), "{src}");
        // Two kernels: the ordinary one counts nothing.
        let plain = &src[..src.find("fz_0_scan").unwrap()];
        assert!(!plain.contains("rlx_scan1"), "{plain}");
        // The full input x and the group's value are counted after the inner values; the
        // broadcast b is not (it is not read whole).
        assert!(
            src.contains("rlx_scan1(__float_as_uint(v0), i, c5)"),
            "{src}"
        );
        assert!(
            src.contains("rlx_scan1(__float_as_uint(t5), i, c6)"),
            "{src}"
        );
        assert!(!src.contains("__float_as_uint(v1)"), "{src}");
    }
}
