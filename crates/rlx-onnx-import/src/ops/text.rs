//! Text-feature ops: TfIdfVectorizer (integer n-grams), lowered onto comparisons, reductions
//! and a MatMul with constant tables.

use crate::ctx::{to_usizes, Ctx, ONode, R};
use rlx_ir::{BinaryOp, DType, NodeId, Op, ReduceKind, Tensor, TensorData};
use std::collections::HashMap;

/// ONNX TfIdfVectorizer (opset 9; onnx reference `op_tfidf_vectorizer.py`), integer pools
/// only (`pool_int64s`; `pool_strings` is an error).
///
/// X `[C]` or `[B, C]` (int32/int64) → f32 `[V]` or `[B, V]`, `V = max(ngram_indexes) + 1`.
/// An n-gram of size `n` in `[min_gram_length, max_gram_length]` is counted at every start
/// `p` and skip distance `d` (`1..=max_skip_count + 1`; unigrams only at `d = 1`) where
/// `X[p + k*d] == gram[k]` for every `k < n`; its count goes to output column
/// `ngram_indexes[j]` (`j` its position among all pool n-grams). `mode`: `TF` counts,
/// `IDF` gives `weights[i]` (1 without weights) where the count is nonzero, `TFIDF`
/// `weights[i] * count`.
///
/// Lowering, per gram size `n` and skip `d`: `n` shifted slices of X compared with the
/// pool's columns (`[B, L, G]`), And-ed, summed over positions (`[B, G]`); the counts go to
/// their output columns through a constant one-hot `[G, V]` MatMul.
pub fn tfidf_vectorizer(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let xd = cx.dims(x);
    let dt = cx.dtype(x);
    if !matches!(dt, DType::I32 | DType::I64) {
        return Err(format!("X must be int32 or int64, got {dt}"));
    }
    if n.attr("pool_strings")
        .is_some_and(|a| !a.strings.is_empty())
    {
        return Err("pool_strings (string n-grams) is not supported".into());
    }
    let (b, c, batched) = match xd[..] {
        [c] => (1, c, false),
        [b, c] => (b, c, true),
        _ => return Err(format!("X must be [C] or [B, C], got {xd:?}")),
    };
    let min_n = n.i("min_gram_length", 0)?;
    let max_n = n.i("max_gram_length", 0)?;
    let max_skip = n.i("max_skip_count", 0)?;
    if min_n < 1 || max_n < min_n || !(0..=1 << 16).contains(&max_skip) {
        return Err(format!(
            "min_gram_length {min_n}, max_gram_length {max_n}, max_skip_count {max_skip} are invalid"
        ));
    }
    let (min_n, max_n, max_skip) = (min_n as usize, max_n as usize, max_skip as usize);
    let mode = n.s("mode", "")?;
    let counts = to_usizes(&n.ints("ngram_counts")?.unwrap_or_default(), "ngram_counts")?;
    let indexes = to_usizes(
        &n.ints("ngram_indexes")?.unwrap_or_default(),
        "ngram_indexes",
    )?;
    let pool = n.ints("pool_int64s")?.unwrap_or_default();
    let weights: Vec<f32> = n
        .attr("weights")
        .map(|a| a.floats.clone())
        .unwrap_or_default();
    let v = indexes.iter().max().map_or(0, |m| m + 1);
    // The output has max(ngram_indexes) + 1 columns; each n-gram size builds a [grams, v]
    // one-hot constant: refuse what no real vocabulary needs before allocating it.
    const MAX_COLUMNS: usize = 1 << 24;
    if v > MAX_COLUMNS || pool.len() > MAX_COLUMNS {
        return Err(format!(
            "ngram_indexes up to {} / a pool of {} ids: more than the {MAX_COLUMNS} RLX supports",
            v.saturating_sub(1),
            pool.len()
        ));
    }
    if !weights.is_empty() && weights.len() < v {
        return Err(format!(
            "weights has {} entries, the output has {v} columns",
            weights.len()
        ));
    }
    // Pool n-grams by size: (gram, global index j), a repeated gram keeping its last j
    // (the reference's trie overwrites the id).
    // Sizes come from ngram_counts' positions: no more than counts.len() of them (a bogus
    // max_gram_length must not size an allocation).
    let mut by_size: Vec<Vec<(Vec<i64>, usize)>> = vec![vec![]; counts.len().min(max_n) + 1];
    let mut j = 0usize;
    for (i, &start) in counts.iter().enumerate() {
        let size = i + 1;
        let end = counts.get(i + 1).copied().unwrap_or(pool.len());
        if start > end || end > pool.len() {
            return Err(format!(
                "ngram_counts {counts:?} do not fit the pool of {}",
                pool.len()
            ));
        }
        let grams = (end - start) / size;
        if (min_n..=max_n).contains(&size) && size < by_size.len() {
            let mut seen: HashMap<&[i64], usize> = HashMap::new();
            for g in 0..grams {
                seen.insert(&pool[start + g * size..start + (g + 1) * size], j + g);
            }
            let mut list: Vec<(Vec<i64>, usize)> =
                seen.into_iter().map(|(g, k)| (g.to_vec(), k)).collect();
            list.sort_by_key(|&(_, k)| k);
            by_size[size] = list;
        }
        j += grams;
    }
    if let Some(&(_, k)) = by_size.iter().flatten().find(|(_, k)| *k >= indexes.len()) {
        return Err(format!(
            "pool n-gram {k} has no entry in ngram_indexes ({} entries)",
            indexes.len()
        ));
    }
    let x2 = cx.reshape(x, vec![b, c])?;
    let mut total: Option<NodeId> = None;
    for (size, grams) in by_size.iter().enumerate() {
        if grams.is_empty() {
            continue;
        }
        let g = grams.len();
        let skips = if size == 1 { 1 } else { max_skip + 1 };
        let mut counts_n: Option<NodeId> = None;
        for d in 1..=skips {
            let span = d * (size - 1);
            if span >= c {
                break;
            }
            let l = c - span;
            let mut hit: Option<NodeId> = None;
            for k in 0..size {
                let w = super::shape::slice_axis(cx, x2, 1, k * d, l)?;
                let w = cx.reshape(w, vec![b, l, 1])?;
                let col: Vec<i64> = grams.iter().map(|(gram, _)| gram[k]).collect();
                let col = Tensor::new(vec![g], TensorData::from_i64(dt, &col))
                    .map_err(|e| e.to_string())?;
                let col = cx.constant(col);
                let eq = cx.binary(BinaryOp::Eq, w, col)?;
                hit = Some(match hit {
                    None => eq,
                    Some(h) => cx.binary(BinaryOp::And, h, eq)?,
                });
            }
            let hit = hit.ok_or("empty n-gram")?;
            let f = cx.cast(hit, DType::F32)?;
            let s = cx.add(
                Op::Reduce {
                    kind: ReduceKind::Sum,
                    axes: vec![1],
                    keepdims: false,
                },
                vec![f],
            )?;
            counts_n = Some(match counts_n {
                None => s,
                Some(t) => cx.binary(BinaryOp::Add, t, s)?,
            });
        }
        let Some(counts_n) = counts_n else { continue };
        if g.saturating_mul(v) > 1 << 28 {
            return Err(format!(
                "{g} n-grams of size {size} x {v} output columns: a one-hot table larger than RLX builds"
            ));
        }
        let mut onehot = vec![0f32; g * v];
        for (r, (_, k)) in grams.iter().enumerate() {
            onehot[r * v + indexes[*k]] = 1.0;
        }
        let m = cx.constant(Tensor::from_f32(&[g, v], onehot).map_err(|e| e.to_string())?);
        let y = cx.add(Op::MatMul, vec![counts_n, m])?;
        total = Some(match total {
            None => y,
            Some(t) => cx.binary(BinaryOp::Add, t, y)?,
        });
    }
    let y = match total {
        Some(t) => t,
        None => {
            let z = cx.scalar(DType::F32, 0.0);
            cx.add(Op::Broadcast { dims: vec![b, v] }, vec![z])?
        }
    };
    let w = (!weights.is_empty())
        .then(|| cx.constant(Tensor::from_f32(&[v], weights[..v].to_vec()).expect("len v")));
    let y = match (mode.as_str(), w) {
        ("TF", _) | ("TFIDF", None) => y,
        ("TFIDF", Some(w)) => cx.binary(BinaryOp::Mul, y, w)?,
        ("IDF", w) => {
            let zero = cx.scalar(DType::F32, 0.0);
            let pos = cx.binary(BinaryOp::Gt, y, zero)?;
            let pos = cx.cast(pos, DType::F32)?;
            match w {
                Some(w) => cx.binary(BinaryOp::Mul, pos, w)?,
                None => pos,
            }
        }
        (m, _) => return Err(format!("mode \"{m}\" must be TF, IDF or TFIDF")),
    };
    let out = if batched { vec![b, v] } else { vec![v] };
    Ok(vec![cx.reshape(y, out)?])
}
