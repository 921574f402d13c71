//! Planning: which kernel (and metadata) runs each node, or why it falls back to the CPU.

use super::*;

/// The `copy_map` launches of a Transpose/Broadcast/Slice/Tile/Pad/Concat node: (input
/// position, metadata, word count) per launch, or why it stays on the CPU.
pub(crate) fn copy_plan(g: &Graph, id: NodeId) -> Result<Vec<(usize, Vec<i64>, u64)>, String> {
    let node = g.node(id);
    let od = node.shape.dims_usize();
    let ind = |k: usize| g.node(node.inputs[k]).shape.dims_usize();
    let dt = |i: NodeId| g.node(i).shape.dtype;
    let odt = node.shape.dtype;
    let words = dev_words(odt).ok_or("no device storage for the dtype")?;
    let ost = strides_of(&od);
    let copy_meta = |rows: Vec<[i64; 7]>, obase: i64, fill: u32| -> Vec<i64> {
        map_meta(rows, obase, fill, words)
    };
    if node.inputs.iter().any(|&i| dt(i) != odt) {
        return Err("inputs and output of different dtypes".into());
    }
    let id0 = ind(0);
    let st = strides_of(&id0);
    let r = od.len();
    let plain = |d: usize| -> [i64; 7] {
        [
            od[d] as i64,
            id0[d] as i64,
            st[d] as i64,
            0,
            1,
            0,
            ost[d] as i64,
        ]
    };
    let n = node.shape.numel() as u64;
    let parts = match &node.op {
        Op::Transpose { perm } => {
            if perm.len() != r
                || id0.len() != r
                || (0..r).any(|d| perm[d] >= r || id0[perm[d]] != od[d])
            {
                return Err(format!(
                    "transpose {perm:?} of {id0:?} does not give {od:?}"
                ));
            }
            let rows = (0..r)
                .map(|d| {
                    [
                        od[d] as i64,
                        id0[perm[d]] as i64,
                        st[perm[d]] as i64,
                        0,
                        1,
                        0,
                        ost[d] as i64,
                    ]
                })
                .collect();
            vec![(0, copy_meta(rows, 0, 0), n)]
        }
        Op::Broadcast { .. } => {
            if id0.len() > r {
                return Err("broadcast to a lower rank".into());
            }
            let off = r - id0.len();
            let mut rows = vec![];
            for d in 0..r {
                if d < off || id0[d - off] == 1 {
                    rows.push([od[d] as i64, 1, 0, 0, 1, 0, ost[d] as i64]);
                } else if id0[d - off] == od[d] {
                    rows.push([
                        od[d] as i64,
                        od[d] as i64,
                        st[d - off] as i64,
                        0,
                        1,
                        0,
                        ost[d] as i64,
                    ]);
                } else {
                    return Err(format!("{id0:?} does not broadcast to {od:?}"));
                }
            }
            vec![(0, copy_meta(rows, 0, 0), n)]
        }
        Op::Slice {
            starts,
            steps,
            sizes,
        } => {
            if starts.len() != r || steps.len() != r || sizes.len() != r || id0.len() != r {
                return Err("slice attributes do not match the rank".into());
            }
            let mut rows = vec![];
            for d in 0..r {
                if sizes[d] != od[d] || steps[d] == 0 {
                    return Err(format!("slice sizes {sizes:?} vs output {od:?}"));
                }
                if sizes[d] > 0 {
                    let last = starts[d] as i64 + (sizes[d] as i64 - 1) * steps[d];
                    if starts[d] >= id0[d] || last < 0 || last >= id0[d] as i64 {
                        return Err(format!("slice axis {d} runs outside the input"));
                    }
                }
                rows.push([
                    od[d] as i64,
                    id0[d] as i64,
                    st[d] as i64,
                    starts[d] as i64,
                    steps[d],
                    0,
                    ost[d] as i64,
                ]);
            }
            vec![(0, copy_meta(rows, 0, 0), n)]
        }
        Op::Tile { repeats } => {
            if repeats.len() != r || id0.len() != r || (0..r).any(|d| id0[d] * repeats[d] != od[d])
            {
                return Err(format!("tile {repeats:?} of {id0:?} does not give {od:?}"));
            }
            let rows = (0..r)
                .map(|d| {
                    let mut x = plain(d);
                    x[5] = 1;
                    x
                })
                .collect();
            vec![(0, copy_meta(rows, 0, 0), n)]
        }
        Op::Pad { pads, mode } => {
            if pads.len() != r
                || id0.len() != r
                || (0..r).any(|d| id0[d] + pads[d].0 + pads[d].1 != od[d])
            {
                return Err(format!("pad {pads:?} of {id0:?} does not give {od:?}"));
            }
            let (m, fill) = match mode {
                PadMode::Constant(v) if odt == DType::F32 => (2, (*v as f32).to_bits()),
                PadMode::Constant(_) => return Err("constant Pad runs on CUDA for f32 only".into()),
                PadMode::Wrap => (1, 0),
                PadMode::Reflect => (3, 0),
                PadMode::Edge => (4, 0),
            };
            if m != 2 && (0..r).any(|d| id0[d] == 0 && od[d] > 0) {
                return Err("reflect/edge/wrap Pad of an empty axis".into());
            }
            if m == 3 && (0..r).any(|d| pads[d].0 >= id0[d].max(1) || pads[d].1 >= id0[d].max(1)) {
                return Err("reflect Pad wider than the axis".into());
            }
            if m == 1 && (0..r).any(|d| pads[d].0 > id0[d] || pads[d].1 > id0[d]) {
                return Err("wrap Pad wider than the axis".into());
            }
            let rows = (0..r)
                .map(|d| {
                    let mut x = plain(d);
                    x[3] = -(pads[d].0 as i64);
                    x[5] = m;
                    x
                })
                .collect();
            vec![(0, copy_meta(rows, 0, fill), n)]
        }
        Op::Concat { axis } => {
            let axis = *axis;
            if axis >= r {
                return Err("concat axis out of range".into());
            }
            let mut parts = vec![];
            let mut at = 0usize;
            for k in 0..node.inputs.len() {
                let ik = ind(k);
                if ik.len() != r || (0..r).any(|d| d != axis && ik[d] != od[d]) {
                    return Err(format!("concat input {k} {ik:?} does not fit {od:?}"));
                }
                let sk = strides_of(&ik);
                let rows = (0..r)
                    .map(|d| {
                        [
                            ik[d] as i64,
                            ik[d] as i64,
                            sk[d] as i64,
                            0,
                            1,
                            0,
                            ost[d] as i64,
                        ]
                    })
                    .collect();
                let cnt = ik.iter().product::<usize>() as u64;
                parts.push((k, copy_meta(rows, (at * ost[axis]) as i64, 0), cnt));
                at += ik[axis];
            }
            if at != od[axis] {
                return Err("concat sizes do not add up to the output".into());
            }
            parts
        }
        other => return Err(format!("{} is not an index-map copy", other.name())),
    };
    let parts = parts
        .into_iter()
        .map(|(k, m, c)| (k, m, c * words as u64))
        .collect();
    Ok(parts)
}

/// `copy_map` metadata: rows (n, in_dim, in_stride, start, step, mode, out_stride) per
/// iteration dim; for 2-word elements (i64) every stride and the base double and a last
/// dim of 2 words is added.
fn map_meta(mut rows: Vec<[i64; 7]>, obase: i64, fill: u32, words: usize) -> Vec<i64> {
    let w = words as i64;
    for x in rows.iter_mut() {
        x[2] *= w;
        x[6] *= w;
    }
    if w == 2 {
        rows.push([2, 2, 1, 0, 1, 0, 1]);
    }
    let mut m = vec![rows.len() as i64, obase * w, fill as i64];
    for x in rows {
        m.extend(x);
    }
    m
}

/// A two-input kernel over broadcast inputs `a`, `b` giving `od` (its metadata pushed to
/// `metas` unless both inputs have the output's dims).
fn binary_step(
    f: CudaFunction,
    a: &[usize],
    b: &[usize],
    od: &[usize],
    metas: &mut Vec<Vec<i64>>,
) -> Result<Step, String> {
    if rlx_ir::broadcast_dims(a, b).as_deref() != Some(od) {
        return Err(format!("inputs {a:?} and {b:?} do not broadcast to {od:?}"));
    }
    let meta = if a == od && b == od {
        None
    } else {
        metas.push(bcast_meta(&[a, b], od));
        Some(metas.len() - 1)
    };
    Ok(Step::Binary { f, meta })
}

/// The step for a node whose output and inputs are all f32, or `Err(reason)` for the CPU.
pub(super) fn plan_node(
    g: &Graph,
    id: NodeId,
    module: &mut dyn FnMut() -> Result<Arc<CudaModule>, String>,
    metas: &mut Vec<Vec<i64>>,
) -> Result<Step, String> {
    let node = g.node(id);
    let od = node.shape.dims_usize();
    let ind = |k: usize| g.node(node.inputs[k]).shape.dims_usize();
    let mut func = |name: &str| -> Result<CudaFunction, String> {
        let m = module().map_err(|e| format!("the kernel module did not build: {e}"))?;
        m.load_function(name)
            .map_err(|e| format!("kernel {name}: {e}"))
    };
    let dt = |i: NodeId| g.node(i).shape.dtype;
    let odt = node.shape.dtype;
    // Float ops compute on f32 words: the output is f32/f16/bf16 and every input has its dtype.
    let all_f32 = || -> Result<(), String> {
        if !float_word(odt) {
            return Err(format!("output {} is not f32/f16/bf16", node.shape));
        }
        if let Some(&bad) = node.inputs.iter().find(|&&i| dt(i) != odt) {
            return Err(format!(
                "input {bad} ({}) is not {odt} like the output",
                g.node(bad).shape
            ));
        }
        Ok(())
    };
    let words = dev_words(odt).unwrap_or(1);
    // bfloat16 values are stored as 16 bits: their kernels are the `_bf` (float) and `_h`
    // (word) instances; nodes without one run the f32-word kernel between conversions
    // (`CudaExecutor::plan_wraps`).
    let bf = odt == DType::BF16;
    let fsfx = if bf { "_bf" } else { "" };
    let wsfx = if bf { "_h" } else { "" };
    match &node.op {
        Op::Reshape { .. } => Ok(Step::Alias),
        Op::Cast { to, .. } if *to == dt(node.inputs[0]) => Ok(Step::Alias),
        // Widening float16 to f32: the words already hold the value (bfloat16 is stored as
        // 16 bits: a copy between conversions, below).
        Op::Cast { to: DType::F32, .. } if dt(node.inputs[0]) == DType::F16 => Ok(Step::Alias),
        // Between float dtypes: a copy, then the output's rounding.
        Op::Cast { to, .. } if float_word(*to) && float_word(dt(node.inputs[0])) => {
            Ok(Step::Unary {
                f: func("u_copy")?,
                p: [0.0, 0.0],
            })
        }
        Op::Cast { to, .. } => {
            let from = dt(node.inputs[0]);
            // To float16/bfloat16 through f32 (the output's rounding follows).
            let to_word = if float_word(*to) { DType::F32 } else { *to };
            let from_word = if float_word(from) { DType::F32 } else { from };
            let kind = match (from_word, to_word) {
                (DType::F32, DType::Bool) => 3,
                (DType::Bool, DType::F32) => 4,
                (DType::I32, DType::F32) => 5,
                (DType::Bool, DType::I32) => 6,
                (DType::I64, DType::F32) => 7,
                (DType::Bool, DType::I64) => 8,
                (DType::I32, DType::I64) => 9,
                (DType::I64, DType::Bool) => 10,
                (DType::I32 | DType::U32, DType::Bool) => 11,
                _ => return Err(format!("no CUDA kernel for Cast {from} -> {to} yet")),
            };
            Ok(Step::UMap {
                f: func("umap_u32")?,
                kind,
                p: [0, 0],
            })
        }
        Op::Unary(u @ (UnaryOp::IsNaN | UnaryOp::IsInf { .. } | UnaryOp::Not)) => {
            let i0 = dt(node.inputs[0]);
            let ok = if matches!(u, UnaryOp::Not) {
                i0 == DType::Bool
            } else {
                float_word(i0)
            };
            if !ok || odt != DType::Bool || ind(0) != od {
                return Err(format!(
                    "{} on {} is not supported on CUDA",
                    node.op.name(),
                    g.node(node.inputs[0]).shape
                ));
            }
            let (kind, p) = match *u {
                UnaryOp::IsNaN => (0, [0, 0]),
                UnaryOp::IsInf { pos, neg } => (1, [pos as i32, neg as i32]),
                _ => (2, [0, 0]),
            };
            Ok(Step::UMap {
                f: func("umap_u32")?,
                kind,
                p,
            })
        }
        Op::Binary(b) if kernels::pred_kernel(*b).is_some() => {
            let (name, idt) = kernels::pred_kernel(*b).expect("checked");
            // Float comparisons take f32/f16/bf16 words alike (both inputs of one dtype).
            let same = |i: NodeId| {
                dt(i) == idt
                    || (idt == DType::F32 && float_word(dt(i)) && dt(i) == dt(node.inputs[0]))
            };
            if odt != DType::Bool || !node.inputs.iter().all(|&i| same(i)) {
                return Err(format!("{:?} on CUDA takes {idt} inputs and gives Bool", b));
            }
            binary_step(func(&name)?, &ind(0), &ind(1), &od, metas)
        }
        Op::Select => {
            if node.inputs.len() != 3
                || dt(node.inputs[0]) != DType::Bool
                || dt(node.inputs[1]) != odt
                || dt(node.inputs[2]) != odt
                || words != 1
            {
                return Err("Select on CUDA takes a Bool condition and two 32-bit values of the output's dtype".into());
            }
            let ds = [ind(0), ind(1), ind(2)];
            for d in &ds {
                if d.len() > od.len()
                    || rlx_ir::broadcast_dims(d, &od).as_deref() != Some(od.as_slice())
                {
                    return Err(format!("input dims {d:?} do not broadcast to {od:?}"));
                }
            }
            let meta = if ds.iter().all(|d| *d == od) {
                None
            } else {
                let mut m = vec![od.len() as i64];
                m.extend(od.iter().map(|&d| d as i64));
                for d in &ds {
                    m.extend(bcast_strides(d, &od).iter().map(|&s| s as i64));
                }
                metas.push(m);
                Some(metas.len() - 1)
            };
            Ok(Step::Select {
                f: func(&format!("select_u32{wsfx}"))?,
                meta,
            })
        }
        Op::Reduce { kind, axes, .. } => {
            all_f32()?;
            let id0 = ind(0);
            if axes.iter().any(|&a| a >= id0.len()) {
                return Err(format!("reduce axes {axes:?} out of range for {id0:?}"));
            }
            let st = strides_of(&id0);
            let (mut kd, mut ks, mut rd, mut rs) = (vec![], vec![], vec![], vec![]);
            for d in 0..id0.len() {
                if axes.contains(&d) {
                    rd.push(id0[d] as i64);
                    rs.push(st[d] as i64);
                } else {
                    kd.push(id0[d] as i64);
                    ks.push(st[d] as i64);
                }
            }
            let nout: i64 = kd.iter().product();
            if nout as usize != node.shape.numel() {
                return Err(format!(
                    "reduce of {id0:?} over {axes:?} does not give {od:?}"
                ));
            }
            let mut m = vec![kd.len() as i64];
            m.extend(&kd);
            m.extend(&ks);
            m.push(rd.len() as i64);
            m.extend(&rd);
            m.extend(&rs);
            metas.push(m);
            let kind = match kind {
                ReduceKind::Sum => 0,
                ReduceKind::Mean => 1,
                ReduceKind::Max => 2,
                ReduceKind::Min => 3,
                ReduceKind::Prod => 4,
            };
            // Trailing axes: every output's inputs are one contiguous row.
            let nr = rd.len();
            let mut sorted = axes.clone();
            sorted.sort_unstable();
            sorted.dedup();
            let trailing = sorted.len() == nr
                && sorted
                    .iter()
                    .enumerate()
                    .all(|(k, &a)| a == id0.len() - nr + k);
            let rows = trailing.then(|| rd.iter().product::<i64>() as u64);
            Ok(Step::Reduce {
                f: func(&format!(
                    "{}{fsfx}",
                    if rows.is_some() {
                        "reduce_rows"
                    } else {
                        "reduce_f32"
                    }
                ))?,
                meta: metas.len() - 1,
                kind,
                nout: nout as u64,
                rows,
            })
        }
        Op::Transpose { .. }
        | Op::Broadcast { .. }
        | Op::Slice { .. }
        | Op::Tile { .. }
        | Op::Pad { .. }
        | Op::Concat { .. } => {
            let parts: Vec<(usize, usize, u64)> = copy_plan(g, id)?
                .into_iter()
                .map(|(k, m, c)| {
                    metas.push(m);
                    (k, metas.len() - 1, c)
                })
                .collect();
            // 32-bit coordinates when every value involved has fewer than 2^31 words.
            let small = |d: &[usize]| d.iter().product::<usize>() * words < (1 << 31);
            let all_small = small(&od) && (0..node.inputs.len()).all(|k| small(&ind(k)));
            Ok(Step::Copy {
                f: func(&format!(
                    "{}{wsfx}",
                    if all_small { "copy_map32" } else { "copy_map" }
                ))?,
                parts,
            })
        }
        Op::Conv(a) => {
            all_f32()?;
            let (xd, wd) = (ind(0), ind(1));
            let ns = xd.len().saturating_sub(2);
            if xd.len() < 3 || wd.len() != xd.len() || od.len() != xd.len() {
                return Err("conv ranks do not match".into());
            }
            let (nn, c, m, gr) = (xd[0], xd[1], wd[0], a.groups.max(1));
            if c % gr != 0 || m % gr != 0 || wd[1] * gr != c || od[0] != nn || od[1] != m {
                return Err(format!(
                    "conv of {xd:?} by {wd:?} (groups {gr}) does not give {od:?}"
                ));
            }
            if a.strides.len() != ns || a.pads.len() != ns || a.dilations.len() != ns {
                return Err("conv attributes do not match the spatial rank".into());
            }
            let has_bias = node.inputs.len() == 3;
            if has_bias && ind(2).iter().product::<usize>() != m {
                return Err("conv bias is not [M]".into());
            }
            let mut meta = vec![
                ns as i64,
                nn as i64,
                c as i64,
                m as i64,
                gr as i64,
                has_bias as i64,
            ];
            for d in 0..ns {
                let (i, k, o, s, p, dl) = (
                    xd[2 + d],
                    wd[2 + d],
                    od[2 + d],
                    a.strides[d],
                    a.pads[d].0,
                    a.dilations[d],
                );
                if o > 0 && s * (o - 1) + dl * (k.max(1) - 1) + 1 > i + p + a.pads[d].1 + s {
                    return Err(format!("conv output dims {od:?} do not fit the input"));
                }
                meta.extend([i as i64, k as i64, o as i64, s as i64, p as i64, dl as i64]);
            }
            // 2-D, groups 1: a GEMM per batch (direct kernel otherwise, and as the reference).
            let gemm_ok = ns == 2 && gr == 1 && od[2] * od[3] > 0;
            let (kh, kw) = (
                wd.get(2).copied().unwrap_or(1),
                wd.get(3).copied().unwrap_or(1),
            );
            let kdim = c * kh * kw;
            let ohw = od.get(2).copied().unwrap_or(0) * od.get(3).copied().unwrap_or(0);
            let pointwise = gemm_ok
                && kh == 1
                && kw == 1
                && a.strides.iter().all(|&s| s == 1)
                && a.pads.iter().all(|&p| p == (0, 0))
                && ohw == xd[2] * xd[3];
            let sizes_ok = i32_of(m, "M").is_ok()
                && i32_of(kdim, "K").is_ok()
                && i32_of(ohw, "OHW").is_ok()
                && i32_of(nn, "N").is_ok()
                && i32_of(m * kdim, "W").is_ok()
                && (pointwise || i32_of(nn * kdim * ohw, "columns").is_ok());
            if gemm_ok && sizes_ok {
                let plan = MatMulPlan {
                    m: m as i32,
                    n: ohw as i32,
                    k: kdim as i32,
                    strided: Some((nn as i32, 0, (kdim * ohw) as i64)),
                    offsets: vec![],
                };
                let im2col = if pointwise {
                    None
                } else {
                    let (pt, pl) = (a.pads[0].0, a.pads[1].0);
                    metas.push(
                        [
                            c,
                            xd[2],
                            xd[3],
                            kh,
                            kw,
                            od[2],
                            od[3],
                            a.strides[0],
                            a.strides[1],
                            pt,
                            pl,
                            a.dilations[0],
                            a.dilations[1],
                        ]
                        .iter()
                        .map(|&v| v as i64)
                        .collect(),
                    );
                    Some((
                        func("im2col_f32")?,
                        metas.len() - 1,
                        (nn * kdim * ohw) as u64,
                    ))
                };
                let bias = if has_bias {
                    Some((func("bias_nchw")?, ohw as u64, m as u64))
                } else {
                    None
                };
                return Ok(Step::ConvGemm { plan, im2col, bias });
            }
            metas.push(meta);
            Ok(Step::Conv {
                f: func("conv_f32")?,
                meta: metas.len() - 1,
            })
        }
        Op::Pool(a) => {
            all_f32()?;
            let xd = ind(0);
            let kind = match a.kind {
                rlx_ir::PoolKind::Max => (0, false),
                rlx_ir::PoolKind::Avg { count_include_pad } => (1, count_include_pad),
                rlx_ir::PoolKind::Lp { .. } => return Err("no CUDA kernel for LpPool yet".into()),
            };
            if xd.len() != 4 || od.len() != 4 || od[0] != xd[0] || od[1] != xd[1] {
                return Err("CUDA pooling takes NCHW (2 spatial dims)".into());
            }
            if a.kernel.len() != 2
                || a.strides.len() != 2
                || a.pads.len() != 2
                || a.dilations.len() != 2
            {
                return Err("pool attributes do not match the spatial rank".into());
            }
            if xd.iter().chain(od.iter()).any(|&d| d > (1 << 30)) {
                return Err("pool dims too large for the CUDA kernel".into());
            }
            metas.push(
                [
                    xd[2],
                    xd[3],
                    od[2],
                    od[3],
                    a.kernel[0],
                    a.kernel[1],
                    a.strides[0],
                    a.strides[1],
                    a.pads[0].0,
                    a.pads[1].0,
                    a.pads[0].1,
                    a.pads[1].1,
                    a.dilations[0],
                    a.dilations[1],
                    kind.0,
                    kind.1 as usize,
                ]
                .iter()
                .map(|&v| v as i64)
                .collect(),
            );
            Ok(Step::Pool {
                f: func(if bf { "pool2d_bf" } else { "pool2d_f32" })?,
                meta: metas.len() - 1,
            })
        }
        Op::Gather { axis } => {
            let dd = ind(0);
            let ixd = ind(1);
            let idt = dt(node.inputs[1]);
            if words != 1 || dt(node.inputs[0]) != odt || !matches!(idt, DType::I64 | DType::I32) {
                return Err("Gather on CUDA takes 32-bit data and i64/i32 indices".into());
            }
            if *axis >= dd.len() {
                return Err("gather axis out of range".into());
            }
            let mut want = dd[..*axis].to_vec();
            want.extend_from_slice(&ixd);
            want.extend_from_slice(&dd[axis + 1..]);
            if want.as_slice() != od.as_slice() {
                return Err(format!("gather of {dd:?} by {ixd:?} does not give {od:?}"));
            }
            Ok(Step::Gather {
                f: func(&format!("gather_u32{wsfx}"))?,
                nidx: ixd.iter().product::<usize>().max(1) as i64,
                dim: dd[*axis] as i64,
                inner: dd[axis + 1..].iter().product::<usize>().max(1) as i64,
                idx64: (idt == DType::I64) as i32,
            })
        }
        Op::GatherND { batch_dims } => {
            let (dd, ixd) = (ind(0), ind(1));
            let idt = dt(node.inputs[1]);
            if words != 1 || dt(node.inputs[0]) != odt || !matches!(idt, DType::I64 | DType::I32) {
                return Err("GatherND on CUDA takes 32-bit data and i64/i32 indices".into());
            }
            let b = *batch_dims;
            let q = ixd.last().copied().unwrap_or(usize::MAX);
            if ixd.is_empty()
                || b >= ixd.len()
                || b.saturating_add(q) > dd.len()
                || dd[..b] != ixd[..b]
            {
                return Err(format!(
                    "GatherND of {dd:?} by {ixd:?} (batch_dims {b}) does not fit"
                ));
            }
            let mut want = ixd[..ixd.len() - 1].to_vec();
            want.extend_from_slice(&dd[b + q..]);
            if want.as_slice() != od.as_slice() {
                return Err(format!(
                    "GatherND of {dd:?} by {ixd:?} does not give {od:?}"
                ));
            }
            let m: usize = ixd[b..ixd.len() - 1].iter().product();
            let slice: usize = dd[b + q..].iter().product();
            let per_batch: usize = dd[b..].iter().product();
            let mut meta = vec![
                q as i64,
                m.max(1) as i64,
                slice.max(1) as i64,
                per_batch as i64,
            ];
            meta.extend(dd[b..b + q].iter().map(|&d| d as i64));
            meta.extend((0..q).map(|k| dd[b + k + 1..].iter().product::<usize>() as i64));
            metas.push(meta);
            Ok(Step::GatherNd {
                f: func(&format!("gather_nd_u32{wsfx}"))?,
                meta: metas.len() - 1,
                idx64: (idt == DType::I64) as i32,
            })
        }
        Op::Unary(_) | Op::Activation(_) => {
            all_f32()?;
            let (name, p) = kernels::unary_kernel(&node.op).ok_or_else(|| {
                format!("no CUDA kernel for {} (Bool/integer op)", node.op.name())
            })?;
            if node.inputs.len() != 1 || ind(0) != od {
                return Err("unary op whose input dims differ from its output's".into());
            }
            Ok(Step::Unary {
                f: func(&format!("{name}{fsfx}"))?,
                p,
            })
        }
        Op::Binary(b) => {
            all_f32()?;
            let name = kernels::binary_kernel(*b)
                .ok_or_else(|| format!("no CUDA kernel for {:?} on f32", b))?;
            if node.inputs.len() != 2 {
                return Err("binary op without two inputs".into());
            }
            binary_step(
                func(&format!("{name}{fsfx}"))?,
                &ind(0),
                &ind(1),
                &od,
                metas,
            )
        }
        Op::MatMul => {
            all_f32()?;
            if node.inputs.len() != 2 {
                return Err("matmul without two inputs".into());
            }
            Ok(Step::MatMul(matmul_plan(&ind(0), &ind(1))?))
        }
        other => Err(format!("no CUDA kernel for {} yet", other.name())),
    }
}
