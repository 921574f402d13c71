//! Symbolic sizes: integer expressions over named dims (`batch`, `past`), the arithmetic
//! ONNX shape computations need (sum, product, floor/ceil division and remainder by a
//! constant, min, max), kept in a canonical form so that equal sizes compare equal
//! (`seq + past` and `past + seq` are one value; `(2*h)/2` is `h`).
//!
//! A [`DimExpr`] is a polynomial with integer coefficients whose atoms are symbols or
//! opaque sub-terms (`floor(e / d)`, `min(a, b)`, `max(a, b)`). Symbols stand for sizes, so
//! they are taken to be non-negative; nothing else is assumed (no upper bounds). Every
//! operation is exact: a result the canonical form cannot state (a division by a symbolic
//! divisor) is `None`, never an approximation. Evaluation checks for i64 overflow.
//!
//! Definitions follow ONNX/NumPy integer semantics: division rounds toward −∞ (`Div` of
//! int64 shapes in exporters' graphs only ever sees non-negative values; `floor` is what
//! torch's `//` and tract's `TDim::div` use), the remainder has the divisor's sign.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// A symbolic integer (see the module docs). `DimExpr::from(3)`, `DimExpr::sym("seq")`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct DimExpr {
    /// The constant term.
    c: i64,
    /// Monomial (sorted atoms, repeated for powers) → non-zero coefficient.
    terms: BTreeMap<Vec<Atom>, i64>,
}

/// An indivisible factor of a monomial.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Atom {
    /// A named size.
    Sym(String),
    /// `floor(e / d)` with `d >= 2` and `e` not a multiple of `d` in canonical form.
    FloorDiv(Box<DimExpr>, i64),
    /// `min(a, b)`, `a < b` in the canonical order.
    Min(Box<DimExpr>, Box<DimExpr>),
    /// `max(a, b)`, `a < b` in the canonical order.
    Max(Box<DimExpr>, Box<DimExpr>),
}

/// Symbol bindings: name → size.
pub type Bindings = HashMap<String, i64>;

impl From<i64> for DimExpr {
    fn from(c: i64) -> DimExpr {
        DimExpr {
            c,
            terms: BTreeMap::new(),
        }
    }
}

impl DimExpr {
    /// The symbol `name`.
    pub fn sym(name: &str) -> DimExpr {
        DimExpr::atom(Atom::Sym(name.to_string()))
    }

    fn atom(a: Atom) -> DimExpr {
        let mut terms = BTreeMap::new();
        terms.insert(vec![a], 1);
        DimExpr { c: 0, terms }
    }

    /// The value when the expression holds no symbol.
    pub fn as_const(&self) -> Option<i64> {
        self.terms.is_empty().then_some(self.c)
    }

    /// True when the expression holds no symbol.
    pub fn is_const(&self) -> bool {
        self.terms.is_empty()
    }

    /// The symbol's name when the expression is exactly one symbol.
    pub fn as_sym(&self) -> Option<&str> {
        if self.c != 0 || self.terms.len() != 1 {
            return None;
        }
        let (m, &k) = self.terms.iter().next()?;
        match (m.as_slice(), k) {
            ([Atom::Sym(s)], 1) => Some(s),
            _ => None,
        }
    }

    /// Every symbol the expression mentions.
    pub fn symbols(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.collect_symbols(&mut out);
        out.sort();
        out.dedup();
        out
    }

    fn collect_symbols(&self, out: &mut Vec<String>) {
        for m in self.terms.keys() {
            for a in m {
                match a {
                    Atom::Sym(s) => out.push(s.clone()),
                    Atom::FloorDiv(e, _) => e.collect_symbols(out),
                    Atom::Min(a, b) | Atom::Max(a, b) => {
                        a.collect_symbols(out);
                        b.collect_symbols(out);
                    }
                }
            }
        }
    }

    /// The value under `b`; `None` when a symbol is unbound or i64 overflows.
    pub fn eval(&self, b: &Bindings) -> Option<i64> {
        let mut acc = self.c;
        for (m, &k) in &self.terms {
            let mut p = k;
            for a in m {
                p = p.checked_mul(a.eval(b)?)?;
            }
            acc = acc.checked_add(p)?;
        }
        Some(acc)
    }

    /// Replace bound symbols by their values (unbound ones stay), re-canonicalized.
    pub fn substitute(&self, b: &Bindings) -> Option<DimExpr> {
        let mut acc = DimExpr::from(self.c);
        for (m, &k) in &self.terms {
            let mut p = DimExpr::from(k);
            for a in m {
                let v = match a {
                    Atom::Sym(s) => match b.get(s) {
                        Some(&v) => DimExpr::from(v),
                        None => DimExpr::sym(s),
                    },
                    Atom::FloorDiv(e, d) => e.substitute(b)?.floor_div(*d)?,
                    Atom::Min(x, y) => x.substitute(b)?.minimum(&y.substitute(b)?),
                    Atom::Max(x, y) => x.substitute(b)?.maximum(&y.substitute(b)?),
                };
                p = p.mul(&v)?;
            }
            acc = acc.add(&p)?;
        }
        Some(acc)
    }

    /// `self + o`; `None` on coefficient overflow.
    pub fn add(&self, o: &DimExpr) -> Option<DimExpr> {
        let mut r = self.clone();
        r.c = r.c.checked_add(o.c)?;
        for (m, &k) in &o.terms {
            let e = r.terms.entry(m.clone()).or_insert(0);
            *e = e.checked_add(k)?;
            if *e == 0 {
                r.terms.remove(m);
            }
        }
        Some(r)
    }

    /// `-self`.
    pub fn neg(&self) -> Option<DimExpr> {
        self.scale(-1)
    }

    /// `self - o`.
    pub fn sub(&self, o: &DimExpr) -> Option<DimExpr> {
        self.add(&o.neg()?)
    }

    fn scale(&self, k: i64) -> Option<DimExpr> {
        if k == 0 {
            return Some(DimExpr::from(0));
        }
        let mut terms = BTreeMap::new();
        for (m, &v) in &self.terms {
            terms.insert(m.clone(), v.checked_mul(k)?);
        }
        Some(DimExpr {
            c: self.c.checked_mul(k)?,
            terms,
        })
    }

    /// `self * o` (polynomial product).
    pub fn mul(&self, o: &DimExpr) -> Option<DimExpr> {
        let mut r = o.scale(self.c)?;
        for (m, &k) in &self.terms {
            // (k * m) * o = k*m*o.c + Σ k*v * (m ++ m2)
            let mut part = DimExpr::default();
            if o.c != 0 {
                part.terms.insert(m.clone(), k.checked_mul(o.c)?);
            }
            for (m2, &v) in &o.terms {
                let mut mm = m.clone();
                mm.extend(m2.iter().cloned());
                mm.sort();
                let e = part.terms.entry(mm).or_insert(0);
                *e = e.checked_add(k.checked_mul(v)?)?;
            }
            part.terms.retain(|_, v| *v != 0);
            r = r.add(&part)?;
        }
        Some(r)
    }

    /// `floor(self / d)`; `None` for `d == 0`. A negative divisor flips both signs.
    pub fn floor_div(&self, d: i64) -> Option<DimExpr> {
        if d == 0 {
            return None;
        }
        if d < 0 {
            return self.neg()?.floor_div(d.checked_neg()?);
        }
        if d == 1 {
            return Some(self.clone());
        }
        if let Some(c) = self.as_const() {
            return Some(DimExpr::from(c.div_euclid(d)));
        }
        // self = d*q + r with the multiples of d pulled out: floor(self/d) = q + floor(r/d).
        let mut q = DimExpr::from(self.c.div_euclid(d));
        let mut r = DimExpr::from(self.c.rem_euclid(d));
        for (m, &k) in &self.terms {
            let (qk, rk) = (k.div_euclid(d), k.rem_euclid(d));
            if qk != 0 {
                q.terms.insert(m.clone(), qk);
            }
            if rk != 0 {
                r.terms.insert(m.clone(), rk);
            }
        }
        if r.is_const() {
            // 0 <= r.c < d
            return Some(q);
        }
        // floor(floor(e/a)/b) = floor(e/(a*b)) for a, b > 0.
        if r.c == 0 && r.terms.len() == 1 {
            let (m, &k) = r.terms.iter().next()?;
            if let ([Atom::FloorDiv(e, a)], 1) = (m.as_slice(), k) {
                return q.add(&e.floor_div(a.checked_mul(d)?)?);
            }
        }
        q.add(&DimExpr::atom(Atom::FloorDiv(Box::new(r), d)))
    }

    /// `ceil(self / d)` = `floor((self + d - 1) / d)` for `d > 0`.
    pub fn ceil_div(&self, d: i64) -> Option<DimExpr> {
        if d <= 0 {
            // ceil(x/d) = -floor(x/(-d)) for d < 0.
            return self.floor_div(d.checked_neg()?)?.neg();
        }
        self.add(&DimExpr::from(d - 1))?.floor_div(d)
    }

    /// `self mod d` with the divisor's sign (Python/ONNX `fmod=0`).
    pub fn rem(&self, d: i64) -> Option<DimExpr> {
        self.sub(&self.floor_div(d)?.scale(d)?)
    }

    /// `self / o` when the division is exact term by term: `o` a non-zero constant dividing
    /// every coefficient, or one monomial (`k * s * t`) dividing every term of `self`
    /// (`(2*b*s*h) / (b*h)` = `2*s`). `None` otherwise, even where the quotient exists
    /// for some bindings only.
    pub fn div_exact(&self, o: &DimExpr) -> Option<DimExpr> {
        if let Some(d) = o.as_const() {
            if d == 0 || self.c % d != 0 || self.terms.values().any(|k| k % d != 0) {
                return None;
            }
            return Some(DimExpr {
                c: self.c / d,
                terms: self.terms.iter().map(|(m, k)| (m.clone(), k / d)).collect(),
            });
        }
        if o.c != 0 || o.terms.len() != 1 || self.c != 0 {
            return None;
        }
        let (om, &ok) = o.terms.iter().next()?;
        let mut terms = BTreeMap::new();
        for (m, &k) in &self.terms {
            if k % ok != 0 {
                return None;
            }
            let mut rest = m.clone();
            for a in om {
                let at = rest.iter().position(|x| x == a)?;
                rest.remove(at);
            }
            terms.insert(rest, k / ok);
        }
        // A term whose monomial became empty is a constant.
        let c = terms.remove(&Vec::new()).unwrap_or(0);
        Some(DimExpr { c, terms })
    }

    /// True when the expression is provably ≥ 0 (symbols are sizes).
    pub fn is_nonneg(&self) -> bool {
        self.c >= 0
            && self
                .terms
                .iter()
                .all(|(m, &k)| k > 0 && m.iter().all(Atom::is_nonneg))
    }

    /// `min(self, o)`, decided when their difference has a known sign.
    pub fn minimum(&self, o: &DimExpr) -> DimExpr {
        match o.sub(self) {
            Some(d) if d.is_nonneg() => return self.clone(),
            Some(d) if d.neg().is_some_and(|n| n.is_nonneg()) => return o.clone(),
            _ => {}
        }
        let (a, b) = if self < o { (self, o) } else { (o, self) };
        DimExpr::atom(Atom::Min(Box::new(a.clone()), Box::new(b.clone())))
    }

    /// `max(self, o)`, decided when their difference has a known sign.
    pub fn maximum(&self, o: &DimExpr) -> DimExpr {
        match o.sub(self) {
            Some(d) if d.is_nonneg() => return o.clone(),
            Some(d) if d.neg().is_some_and(|n| n.is_nonneg()) => return self.clone(),
            _ => {}
        }
        let (a, b) = if self < o { (self, o) } else { (o, self) };
        DimExpr::atom(Atom::Max(Box::new(a.clone()), Box::new(b.clone())))
    }
}

impl Atom {
    fn is_nonneg(&self) -> bool {
        match self {
            Atom::Sym(_) => true,
            Atom::FloorDiv(e, _) => e.is_nonneg(),
            Atom::Min(a, b) => a.is_nonneg() && b.is_nonneg(),
            Atom::Max(a, b) => a.is_nonneg() || b.is_nonneg(),
        }
    }

    fn eval(&self, b: &Bindings) -> Option<i64> {
        match self {
            Atom::Sym(s) => b.get(s).copied(),
            Atom::FloorDiv(e, d) => Some(e.eval(b)?.div_euclid(*d)),
            Atom::Min(x, y) => Some(x.eval(b)?.min(y.eval(b)?)),
            Atom::Max(x, y) => Some(x.eval(b)?.max(y.eval(b)?)),
        }
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::Sym(s) => f.write_str(s),
            Atom::FloorDiv(e, d) => write!(f, "floor(({e})/{d})"),
            Atom::Min(a, b) => write!(f, "min({a}, {b})"),
            Atom::Max(a, b) => write!(f, "max({a}, {b})"),
        }
    }
}

impl fmt::Display for DimExpr {
    /// `2*past + seq + 1`, `floor((h)/4)`, `0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (m, &k) in &self.terms {
            let (sign, mag) = if k < 0 {
                ("-", -(k as i128))
            } else {
                ("+", k as i128)
            };
            if first {
                if sign == "-" {
                    f.write_str("-")?;
                }
            } else {
                write!(f, " {sign} ")?;
            }
            first = false;
            if mag != 1 {
                write!(f, "{mag}*")?;
            }
            for (i, a) in m.iter().enumerate() {
                if i > 0 {
                    f.write_str("*")?;
                }
                write!(f, "{a}")?;
            }
        }
        if first {
            return write!(f, "{}", self.c);
        }
        if self.c != 0 {
            let (sign, mag) = if self.c < 0 {
                ("-", -(self.c as i128))
            } else {
                ("+", self.c as i128)
            };
            write!(f, " {sign} {mag}")?;
        }
        Ok(())
    }
}

/// A relation an import decision relied on: the graph built at the probe sizes is the graph
/// of every binding where all its guards hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Guard {
    /// `a == b`.
    Eq(DimExpr, DimExpr),
    /// `a != b`.
    Ne(DimExpr, DimExpr),
    /// `a < b`.
    Lt(DimExpr, DimExpr),
    /// `a >= b`.
    Ge(DimExpr, DimExpr),
}

impl Guard {
    /// Whether the guard holds under `b`; `None` when a symbol is unbound.
    pub fn holds(&self, b: &Bindings) -> Option<bool> {
        Some(match self {
            Guard::Eq(x, y) => x.eval(b)? == y.eval(b)?,
            Guard::Ne(x, y) => x.eval(b)? != y.eval(b)?,
            Guard::Lt(x, y) => x.eval(b)? < y.eval(b)?,
            Guard::Ge(x, y) => x.eval(b)? >= y.eval(b)?,
        })
    }

    /// True when the guard holds for every binding (decided from the canonical form).
    pub fn is_trivial(&self) -> bool {
        match self {
            Guard::Eq(x, y) => x == y,
            Guard::Ne(x, y) => {
                y.sub(x).is_some_and(|d| d.is_nonneg() && d.c > 0)
                    || x.sub(y).is_some_and(|d| d.is_nonneg() && d.c > 0)
            }
            Guard::Lt(x, y) => y.sub(x).is_some_and(|d| d.is_nonneg() && d.c > 0),
            Guard::Ge(x, y) => x.sub(y).is_some_and(|d| d.is_nonneg()),
        }
    }
}

impl fmt::Display for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Guard::Eq(a, b) => write!(f, "{a} == {b}"),
            Guard::Ne(a, b) => write!(f, "{a} != {b}"),
            Guard::Lt(a, b) => write!(f, "{a} < {b}"),
            Guard::Ge(a, b) => write!(f, "{a} >= {b}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: &str) -> DimExpr {
        DimExpr::sym(n)
    }
    fn k(c: i64) -> DimExpr {
        DimExpr::from(c)
    }

    /// A tiny deterministic generator (xorshift) for the random expression tests.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A random expression and its value under `b`, computed with plain i64 arithmetic
    /// (the independent reference: floor division via `div_euclid` for positive divisors).
    fn random_expr(r: &mut Rng, depth: u32, b: &Bindings) -> (DimExpr, i64) {
        if depth == 0 || r.below(4) == 0 {
            return match r.below(3) {
                0 => {
                    let c = r.below(13) as i64 - 4;
                    (k(c), c)
                }
                1 => (s("a"), b["a"]),
                _ => (s("b"), b["b"]),
            };
        }
        let (x, xv) = random_expr(r, depth - 1, b);
        match r.below(8) {
            0 | 1 => {
                let (y, yv) = random_expr(r, depth - 1, b);
                (x.add(&y).unwrap(), xv + yv)
            }
            2 => {
                let (y, yv) = random_expr(r, depth - 1, b);
                (x.sub(&y).unwrap(), xv - yv)
            }
            3 => {
                let (y, yv) = random_expr(r, depth - 1, b);
                (x.mul(&y).unwrap(), xv * yv)
            }
            4 => {
                let d = r.below(5) as i64 + 1;
                (x.floor_div(d).unwrap(), xv.div_euclid(d))
            }
            5 => {
                let d = r.below(5) as i64 + 1;
                (x.ceil_div(d).unwrap(), -((-xv).div_euclid(d)))
            }
            6 => {
                let (y, yv) = random_expr(r, depth - 1, b);
                (x.minimum(&y), xv.min(yv))
            }
            _ => {
                let d = r.below(4) as i64 + 2;
                (x.rem(d).unwrap(), xv.rem_euclid(d))
            }
        }
    }

    #[test]
    fn canonical_form_makes_equal_sizes_equal() {
        let a = s("seq").add(&s("past")).unwrap();
        let b = s("past").add(&s("seq")).unwrap();
        assert_eq!(a, b);
        assert_eq!(k(2).mul(&s("h")).unwrap().floor_div(2).unwrap(), s("h"));
        assert_eq!(s("h").mul(&k(4)).unwrap().ceil_div(4).unwrap(), s("h"));
        assert_eq!(s("t").sub(&s("t")).unwrap(), k(0));
        // (4*h + 3) / 4 = h (the remainder 3 < 4 floors away).
        let e = s("h").mul(&k(4)).unwrap().add(&k(3)).unwrap();
        assert_eq!(e.floor_div(4).unwrap(), s("h"));
        // floor(floor(x/2)/3) = floor(x/6).
        assert_eq!(
            s("x").floor_div(2).unwrap().floor_div(3).unwrap(),
            s("x").floor_div(6).unwrap()
        );
        assert_eq!(s("x").minimum(&s("x").add(&k(1)).unwrap()), s("x"));
        assert_eq!(k(0).minimum(&s("x")), k(0), "sizes are non-negative");
        assert_eq!(s("x").maximum(&k(0)), s("x"));
        assert_eq!(s("x").as_sym(), Some("x"));
        assert_eq!(s("x").mul(&k(2)).unwrap().as_sym(), None);
    }

    #[test]
    fn display_reads_like_arithmetic() {
        let e = s("past").mul(&k(2)).unwrap().add(&s("seq")).unwrap();
        assert_eq!(e.add(&k(1)).unwrap().to_string(), "2*past + seq + 1");
        assert_eq!(s("a").sub(&k(3)).unwrap().to_string(), "a - 3");
        assert_eq!(k(-5).to_string(), "-5");
        assert_eq!(s("h").floor_div(4).unwrap().to_string(), "floor((h)/4)");
    }

    #[test]
    fn random_expressions_evaluate_like_integer_arithmetic() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..4000 {
            let mut b = Bindings::new();
            b.insert("a".into(), r.below(9) as i64);
            b.insert("b".into(), r.below(40) as i64);
            let (e, v) = random_expr(&mut r, 4, &b);
            assert_eq!(e.eval(&b), Some(v), "case {case}: {e} under {b:?}");
            // Substituting one symbol, then evaluating the rest, gives the same value.
            let mut only_a = Bindings::new();
            only_a.insert("a".into(), b["a"]);
            let part = e.substitute(&only_a).unwrap();
            assert!(!part.symbols().contains(&"a".to_string()), "{part}");
            assert_eq!(part.eval(&b), Some(v), "case {case}: {e} -> {part}");
            assert_eq!(e.substitute(&b).unwrap().as_const(), Some(v));
        }
    }

    #[test]
    fn unbound_symbols_and_overflow_give_none() {
        let b = Bindings::new();
        assert_eq!(s("x").eval(&b), None);
        let mut big = Bindings::new();
        big.insert("x".into(), i64::MAX);
        assert_eq!(s("x").add(&k(1)).unwrap().eval(&big), None);
        assert_eq!(s("x").floor_div(0), None);
    }

    #[test]
    fn exact_division() {
        let bsh = s("b").mul(&s("s")).unwrap().mul(&k(32)).unwrap();
        assert_eq!(
            bsh.div_exact(&s("b").mul(&k(4)).unwrap()),
            Some(s("s").mul(&k(8)).unwrap())
        );
        assert_eq!(bsh.div_exact(&k(32)), Some(s("b").mul(&s("s")).unwrap()));
        assert_eq!(bsh.div_exact(&k(3)), None);
        assert_eq!(bsh.div_exact(&s("t")), None);
        assert_eq!(s("s").div_exact(&s("s")), Some(k(1)));
        assert_eq!(s("s").add(&k(1)).unwrap().div_exact(&s("s")), None);
        // Checked against evaluation on a grid.
        let e = s("a").mul(&s("b")).unwrap().mul(&k(6)).unwrap();
        let q = e.div_exact(&s("a").mul(&k(3)).unwrap()).unwrap();
        for a in 1..5 {
            for bb in 0..5 {
                let mut m = Bindings::new();
                m.insert("a".into(), a);
                m.insert("b".into(), bb);
                assert_eq!(q.eval(&m).unwrap() * 3 * a, e.eval(&m).unwrap());
            }
        }
    }

    #[test]
    fn guards() {
        let mut b = Bindings::new();
        b.insert("s".into(), 3);
        assert_eq!(Guard::Eq(s("s"), k(3)).holds(&b), Some(true));
        assert_eq!(Guard::Ne(s("s"), k(3)).holds(&b), Some(false));
        assert!(Guard::Ne(s("s"), k(-1)).is_trivial());
        assert!(Guard::Ge(s("s"), k(0)).is_trivial());
        assert!(!Guard::Ge(s("s"), k(1)).is_trivial());
        assert!(Guard::Lt(s("s"), s("s").add(&k(1)).unwrap()).is_trivial());
    }
}
