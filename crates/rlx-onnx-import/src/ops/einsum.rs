//! ONNX Einsum, lowered onto Gather (diagonals), Reduce (summed-out labels), Transpose,
//! Reshape and batched MatMul (pairwise contraction, left to right).
//!
//! Equation handling follows `numpy.einsum`: spaces are ignored; `...` stands for the
//! leading dims a term does not name (right-aligned across operands, and first in an implicit
//! output); without `->` the output is the labels used exactly once, alphabetically.
//! Labels shared by two operands must have equal sizes (no size-1 broadcasting of labels).

use crate::ctx::{Ctx, ONode, R};
use rlx_ir::{NodeId, Op, ReduceKind};

/// One operand during lowering: its node and one label per axis.
struct Term {
    node: NodeId,
    labels: Vec<char>,
}

/// Expand `...` into placeholder labels (`'\u{100}' + k`, k counted from the right).
fn expand(term: &str, rank: usize, what: &str) -> R<Vec<char>> {
    let (named, ell) = match term.find("...") {
        Some(p) => (format!("{}{}", &term[..p], &term[p + 3..]), Some(p)),
        None => (term.to_string(), None),
    };
    if named.contains('.') {
        return Err(format!("{what} \"{term}\" has a stray '.'"));
    }
    if let Some(c) = named.chars().find(|c| !c.is_ascii_alphabetic()) {
        return Err(format!("{what} \"{term}\" has the invalid label '{c}'"));
    }
    let n = named.chars().count();
    match ell {
        None if n != rank => Err(format!(
            "{what} \"{term}\" names {n} axes of a rank-{rank} input"
        )),
        None => Ok(named.chars().collect()),
        Some(p) => {
            let k = rank
                .checked_sub(n)
                .ok_or_else(|| format!("{what} \"{term}\" names more axes than rank {rank}"))?;
            let head: Vec<char> = term[..p].chars().collect();
            let tail: Vec<char> = term[p + 3..].chars().collect();
            let mut v = head;
            v.extend(
                (0..k)
                    .rev()
                    .map(|j| char::from_u32(0x100 + j as u32).unwrap_or('?')),
            );
            v.extend(tail);
            Ok(v)
        }
    }
}

/// Take the diagonal of every label repeated within `t`.
fn diagonals(cx: &mut Ctx, t: &mut Term) -> R<()> {
    loop {
        let dup = t.labels.iter().enumerate().find_map(|(i, c)| {
            t.labels[i + 1..]
                .iter()
                .position(|d| d == c)
                .map(|j| (i, i + 1 + j))
        });
        let Some((i, j)) = dup else { return Ok(()) };
        let d = cx.dims(t.node);
        if d[i] != d[j] {
            return Err(format!(
                "label '{}' has sizes {} and {} in one operand",
                t.labels[i], d[i], d[j]
            ));
        }
        let r = d.len();
        // move i, j to the end, flatten them, gather the diagonal.
        let mut perm: Vec<usize> = (0..r).filter(|&a| a != i && a != j).collect();
        perm.extend([i, j]);
        let x = cx.add(Op::Transpose { perm: perm.clone() }, vec![t.node])?;
        let mut fd: Vec<usize> = perm[..r - 2].iter().map(|&a| d[a]).collect();
        let n = d[i];
        fd.push(n * n);
        let x = cx.reshape(x, fd)?;
        let idx: Vec<i64> = (0..n as i64).map(|k| k * (n as i64 + 1)).collect();
        let idx = cx.i64s(&idx);
        let x = cx.add(Op::Gather { axis: r - 2 }, vec![x, idx])?;
        let mut labels: Vec<char> = perm[..r - 2].iter().map(|&a| t.labels[a]).collect();
        labels.push(t.labels[i]);
        *t = Term { node: x, labels };
    }
}

/// Sum out the labels of `t` that are not in `keep`.
fn sum_out(cx: &mut Ctx, t: &mut Term, keep: &[char]) -> R<()> {
    let axes: Vec<usize> = (0..t.labels.len())
        .filter(|&a| !keep.contains(&t.labels[a]))
        .collect();
    if axes.is_empty() {
        return Ok(());
    }
    t.node = cx.add(
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes: axes.clone(),
            keepdims: false,
        },
        vec![t.node],
    )?;
    t.labels = (0..t.labels.len())
        .filter(|a| !axes.contains(a))
        .map(|a| t.labels[a])
        .collect();
    Ok(())
}

/// Transpose `t` so its labels read `order` (a permutation of them).
fn arrange(cx: &mut Ctx, t: &Term, order: &[char]) -> R<NodeId> {
    let perm: Vec<usize> = order
        .iter()
        .map(|c| t.labels.iter().position(|d| d == c).unwrap_or(0))
        .collect();
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(t.node);
    }
    cx.add(Op::Transpose { perm }, vec![t.node])
}

/// Contract `a` and `b`, keeping the labels in `keep`.
fn contract(cx: &mut Ctx, a: Term, b: Term, keep: &[char]) -> R<Term> {
    let size = |cx: &Ctx, t: &Term, c: char| {
        let p = t.labels.iter().position(|&d| d == c).unwrap_or(0);
        cx.dims(t.node)[p]
    };
    let batch: Vec<char> = a
        .labels
        .iter()
        .copied()
        .filter(|c| b.labels.contains(c) && keep.contains(c))
        .collect();
    let inner: Vec<char> = a
        .labels
        .iter()
        .copied()
        .filter(|c| b.labels.contains(c) && !keep.contains(c))
        .collect();
    let a_only: Vec<char> = a
        .labels
        .iter()
        .copied()
        .filter(|c| !b.labels.contains(c))
        .collect();
    let b_only: Vec<char> = b
        .labels
        .iter()
        .copied()
        .filter(|c| !a.labels.contains(c))
        .collect();
    for &c in batch.iter().chain(&inner) {
        if size(cx, &a, c) != size(cx, &b, c) {
            return Err(format!(
                "label '{c}' has sizes {} and {} in two operands",
                size(cx, &a, c),
                size(cx, &b, c)
            ));
        }
    }
    let prod =
        |cx: &Ctx, t: &Term, ls: &[char]| -> usize { ls.iter().map(|&c| size(cx, t, c)).product() };
    let (nb, ni, na, nbo) = (
        prod(cx, &a, &batch),
        prod(cx, &a, &inner),
        prod(cx, &a, &a_only),
        prod(cx, &b, &b_only),
    );
    let mut out_dims: Vec<usize> = batch.iter().map(|&c| size(cx, &a, c)).collect();
    out_dims.extend(a_only.iter().map(|&c| size(cx, &a, c)));
    out_dims.extend(b_only.iter().map(|&c| size(cx, &b, c)));
    let ao: Vec<char> = batch.iter().chain(&a_only).chain(&inner).copied().collect();
    let bo: Vec<char> = batch.iter().chain(&inner).chain(&b_only).copied().collect();
    let an = arrange(cx, &a, &ao)?;
    let bn = arrange(cx, &b, &bo)?;
    let an = cx.reshape(an, vec![nb, na, ni])?;
    let bn = cx.reshape(bn, vec![nb, ni, nbo])?;
    let y = cx.add(Op::MatMul, vec![an, bn])?;
    let y = cx.reshape(y, out_dims)?;
    let labels = batch.into_iter().chain(a_only).chain(b_only).collect();
    Ok(Term { node: y, labels })
}

/// ONNX Einsum.
pub fn einsum(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let eq: String = n
        .s("equation", "")?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != n.n_inputs() {
        return Err(format!(
            "equation \"{eq}\" has {} operands but the node has {} inputs",
            terms.len(),
            n.n_inputs()
        ));
    }
    let mut ops = Vec::with_capacity(terms.len());
    let mut max_ell = 0;
    for (i, t) in terms.iter().enumerate() {
        let x = n.inp(i)?;
        let labels = expand(t, cx.rank(x), "operand")?;
        max_ell = max_ell.max(labels.iter().filter(|c| (**c as u32) >= 0x100).count());
        ops.push(Term { node: x, labels });
    }
    let ell: Vec<char> = (0..max_ell)
        .rev()
        .map(|j| char::from_u32(0x100 + j as u32).unwrap_or('?'))
        .collect();
    let out: Vec<char> = match rhs {
        Some(r) => {
            let named = r.replace("...", "");
            let labels = expand(
                &r,
                named.chars().count() + if r.contains("...") { max_ell } else { 0 },
                "output",
            )?;
            for c in &labels {
                if !ops.iter().any(|t| t.labels.contains(c)) {
                    return Err(format!("output label '{c}' is not an input label"));
                }
            }
            labels
        }
        None => {
            let mut count = std::collections::BTreeMap::new();
            for t in &ops {
                for &c in &t.labels {
                    if (c as u32) < 0x100 {
                        *count.entry(c).or_insert(0) += 1;
                    }
                }
            }
            ell.iter()
                .copied()
                .chain(count.into_iter().filter(|(_, k)| *k == 1).map(|(c, _)| c))
                .collect()
        }
    };
    for t in ops.iter_mut() {
        diagonals(cx, t)?;
    }
    let mut iter = ops.into_iter();
    let mut acc = iter.next().ok_or("Einsum needs at least one input")?;
    let rest: Vec<Term> = iter.collect();
    // after[k]: labels of the operands merged after rest[k].
    let after: Vec<Vec<char>> = (0..rest.len())
        .map(|k| {
            rest[k + 1..]
                .iter()
                .flat_map(|t| t.labels.clone())
                .collect()
        })
        .collect();
    for (mut b, later) in rest.into_iter().zip(after) {
        let mut keep = out.clone();
        keep.extend(later);
        let mut keep_a = keep.clone();
        keep_a.extend(&b.labels);
        sum_out(cx, &mut acc, &keep_a)?;
        let mut keep_b = keep.clone();
        keep_b.extend(&acc.labels);
        sum_out(cx, &mut b, &keep_b)?;
        acc = contract(cx, acc, b, &keep)?;
    }
    sum_out(cx, &mut acc, &out)?;
    Ok(vec![arrange(cx, &acc, &out)?])
}
