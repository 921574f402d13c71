//! Bit codes of the storage-only narrow types: float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ,
//! E8M0), float4 (E2M1) and the 4- and 2-bit integers.
//!
//! A narrow tensor holds one code per element in the low bits of a `u8`
//! (`TensorData::Narrow`). Conversions follow ONNX `Cast` (onnx `docs/Operators.md#Cast`,
//! `onnx/reference/ops/op_cast.py`), whose reference is `ml_dtypes`:
//! * float → narrow float rounds the exact value to nearest, ties to even;
//! * with `saturate` (the ONNX default) values beyond the largest finite value, ±Inf
//!   included, become ±max; without it they become Inf (E5M2) or NaN (the others);
//!   FLOAT4E2M1 has neither, so it always saturates and NaN becomes 0x8 (as `ml_dtypes`);
//! * the FNUZ types have no negative zero (-0 → 0x00) and one NaN, 0x80;
//! * → 4/2-bit integers truncates toward zero and wraps like C (`ml_dtypes` astype):
//!   `9.0 → int4 -7`; NaN and ±Inf give 0;
//! * FLOAT8E8M0 (exponent only, `2^(code-127)`, 0xFF NaN) follows onnx's
//!   `numpy_helper.to_float8e8m0`: the value is taken as float32, its sign dropped, its
//!   biased exponent is the code, rounded by ONNX Cast's `round_mode` ([`E8M0Round`],
//!   default `up`: any nonzero mantissa bumps the exponent); NaN and ±Inf give 0xFF; with
//!   `saturate` a bump past 0xFE stays at 0xFE (2^127), without it it gives 0xFF.

use crate::DType;

/// How a minifloat encodes its special values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Special {
    /// IEEE-like: the top exponent holds Inf (mantissa 0) and NaN (E5M2).
    Ieee,
    /// Finite: only S.1111.111 is NaN (E4M3FN).
    Fn,
    /// Finite, unsigned zero: 0x80 is the only NaN (E4M3FNUZ, E5M2FNUZ).
    Fnuz,
    /// No NaN, no Inf (E2M1).
    None,
}

/// Parameters of a narrow float format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MiniFloat {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    special: Special,
}

impl MiniFloat {
    /// The format of a narrow float dtype (`None` for every other dtype).
    pub fn of(d: DType) -> Option<MiniFloat> {
        let (exp_bits, man_bits, bias, special) = match d {
            DType::F8E4M3FN => (4, 3, 7, Special::Fn),
            DType::F8E4M3FNUZ => (4, 3, 8, Special::Fnuz),
            DType::F8E5M2 => (5, 2, 15, Special::Ieee),
            DType::F8E5M2FNUZ => (5, 2, 16, Special::Fnuz),
            DType::F4E2M1 => (2, 1, 1, Special::None),
            _ => return None,
        };
        Some(MiniFloat {
            exp_bits,
            man_bits,
            bias,
            special,
        })
    }

    fn sign_bit(self) -> u8 {
        1 << (self.exp_bits + self.man_bits)
    }

    fn exp_max(self) -> u32 {
        (1 << self.exp_bits) - 1
    }

    /// Largest finite value (448, 240, 57344, 57344, 6).
    pub fn max(self) -> f64 {
        let m = (1u32 << self.man_bits) as f64;
        let (e, man) = match self.special {
            Special::Ieee => (self.exp_max() - 1, m - 1.0),
            Special::Fn => (self.exp_max(), m - 2.0),
            Special::Fnuz | Special::None => (self.exp_max(), m - 1.0),
        };
        (1.0 + man / m) * 2f64.powi(e as i32 - self.bias)
    }

    /// The value of code `c` (bits above the format's width are ignored).
    pub fn decode(self, c: u8) -> f64 {
        let width = self.exp_bits + self.man_bits + 1;
        let c = if width >= 8 {
            c
        } else {
            c & ((1u8 << width) - 1)
        };
        let neg = c & self.sign_bit() != 0;
        let e = ((c >> self.man_bits) as u32) & self.exp_max();
        let man = (c as u32) & ((1 << self.man_bits) - 1);
        match self.special {
            Special::Fnuz if c == 0x80 => return f64::NAN,
            Special::Fn if e == self.exp_max() && man == (1 << self.man_bits) - 1 => {
                return f64::NAN
            }
            Special::Ieee if e == self.exp_max() => {
                return if man != 0 {
                    f64::NAN
                } else if neg {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                }
            }
            _ => {}
        }
        let m = (1u32 << self.man_bits) as f64;
        let mag = if e == 0 {
            man as f64 / m * 2f64.powi(1 - self.bias)
        } else {
            (1.0 + man as f64 / m) * 2f64.powi(e as i32 - self.bias)
        };
        if neg {
            -mag
        } else {
            mag
        }
    }

    fn nan_code(self, neg: bool) -> u8 {
        let s = if neg { self.sign_bit() } else { 0 };
        match self.special {
            Special::Fnuz => 0x80,
            Special::Fn => s | 0x7f,
            // E5M2: quiet NaN S.11111.10, as ml_dtypes writes it.
            Special::Ieee => s | 0x7e,
            // No NaN: ml_dtypes gives -0.
            Special::None => self.sign_bit(),
        }
    }

    /// Code of the exactly representable magnitude `v` (0 <= v <= max) with sign `neg`.
    fn pack(self, neg: bool, v: f64) -> u8 {
        let emin = 1 - self.bias;
        let s = if neg { self.sign_bit() } else { 0 };
        if v == 0.0 {
            return if self.special == Special::Fnuz { 0 } else { s };
        }
        let e = exponent(v);
        let m = 1u32 << self.man_bits;
        let (ef, man) = if e < emin {
            (0, (v / 2f64.powi(emin - self.man_bits as i32)) as u32)
        } else {
            (
                (e + self.bias) as u32,
                (v / 2f64.powi(e - self.man_bits as i32)) as u32 - m,
            )
        };
        s | ((ef << self.man_bits) | man) as u8
    }

    /// Encode `x` (round to nearest, ties to even); see the module doc for `saturate`.
    pub fn encode(self, x: f64, saturate: bool) -> u8 {
        let neg = x.is_sign_negative();
        if x.is_nan() {
            return self.nan_code(neg);
        }
        let max = self.max();
        let overflow = |neg: bool| -> u8 {
            if saturate || self.special == Special::None {
                self.pack(neg, max)
            } else if self.special == Special::Ieee {
                (if neg { self.sign_bit() } else { 0 }) | ((self.exp_max() << self.man_bits) as u8)
            } else {
                self.nan_code(neg)
            }
        };
        let a = x.abs();
        if a.is_infinite() {
            return overflow(neg);
        }
        let emin = 1 - self.bias;
        let e = exponent(a).max(emin);
        // Quantum at this exponent; a/q is exact in f64 (division by a power of two).
        let q = 2f64.powi(e - self.man_bits as i32);
        let r = (a / q).round_ties_even() * q;
        if r > max {
            return overflow(neg);
        }
        self.pack(neg, r)
    }
}

/// Rounding of a cast to FLOAT8E8M0: ONNX Cast's `round_mode` attribute (opset 24+).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum E8M0Round {
    /// Toward +Inf in magnitude: a nonzero mantissa takes the next exponent (ONNX default).
    #[default]
    Up,
    /// Toward zero: the mantissa is dropped.
    Down,
    /// To nearest (onnx's guard/round/sticky rule on the float32 mantissa).
    Nearest,
}

impl E8M0Round {
    /// Parse ONNX's `round_mode` string: `up`, `down` or `nearest`.
    pub fn parse(s: &str) -> Option<E8M0Round> {
        match s {
            "up" => Some(E8M0Round::Up),
            "down" => Some(E8M0Round::Down),
            "nearest" => Some(E8M0Round::Nearest),
            _ => None,
        }
    }
}

/// The value of FLOAT8E8M0 code `c`: `2^(c - 127)`, NaN for 0xFF.
pub fn decode_e8m0(c: u8) -> f64 {
    if c == 0xff {
        f64::NAN
    } else {
        2f64.powi(c as i32 - 127)
    }
}

/// The FLOAT8E8M0 code of `x` (onnx `numpy_helper.to_float8e8m0`; see the module doc).
pub fn encode_e8m0(x: f64, saturate: bool, round: E8M0Round) -> u8 {
    let bits = (x as f32).to_bits();
    let e = (bits >> 23) & 0xff;
    if e == 0xff {
        return 0xff;
    }
    let bump = match round {
        E8M0Round::Down => false,
        E8M0Round::Up => bits & 0x7f_ffff != 0,
        E8M0Round::Nearest => {
            let g = bits & 0x40_0000 != 0;
            let r = bits & 0x20_0000 != 0;
            let st = bits & 0x1f_ffff != 0;
            g && (r || st || e > 0)
        }
    };
    if bump && !(saturate && e == 0xfe) {
        (e + 1) as u8
    } else {
        e as u8
    }
}

/// `floor(log2(v))` of a positive finite `v`, exactly (from the f64 exponent bits;
/// f64 subnormals, far below every narrow format, report -1023).
fn exponent(v: f64) -> i32 {
    ((v.to_bits() >> 52) & 0x7ff) as i32 - 1023
}

/// Signedness and bit width of a narrow integer dtype.
fn int_format(d: DType) -> Option<(bool, u32)> {
    match d {
        DType::I4 => Some((true, 4)),
        DType::U4 => Some((false, 4)),
        DType::I2 => Some((true, 2)),
        DType::U2 => Some((false, 2)),
        _ => None,
    }
}

/// The value of code `c` of narrow dtype `d` (sign-extended for I4/I2). Panics if `d` is
/// not narrow.
pub fn decode_f64(d: DType, c: u8) -> f64 {
    if d == DType::F8E8M0 {
        return decode_e8m0(c);
    }
    if let Some(m) = MiniFloat::of(d) {
        return m.decode(c);
    }
    decode_i64(d, c) as f64
}

/// The integer value of code `c` of a narrow dtype; floats are decoded and truncated
/// toward zero (NaN → 0).
pub fn decode_i64(d: DType, c: u8) -> i64 {
    match int_format(d) {
        Some((signed, w)) => {
            let v = (c as i64) & ((1 << w) - 1);
            if signed && v >= 1 << (w - 1) {
                v - (1 << w)
            } else {
                v
            }
        }
        None => decode_f64(d, c) as i64,
    }
}

/// The code of integer `x` in narrow dtype `d`: integers wrap (keep the low bits), floats
/// round as [`encode_f64`] with saturation.
pub fn encode_i64(d: DType, x: i64) -> u8 {
    match int_format(d) {
        Some((_, w)) => (x & ((1 << w) - 1)) as u8,
        None => encode_f64(d, x as f64, true),
    }
}

/// The code of `x` in narrow dtype `d` (ONNX Cast; see the module doc). FLOAT8E8M0 rounds
/// `up` (ONNX's default `round_mode`; [`encode_e8m0`] takes the others).
pub fn encode_f64(d: DType, x: f64, saturate: bool) -> u8 {
    if d == DType::F8E8M0 {
        return encode_e8m0(x, saturate, E8M0Round::Up);
    }
    match MiniFloat::of(d) {
        Some(m) => m.encode(x, saturate),
        None => {
            if x.is_finite() {
                encode_i64(d, x as i64)
            } else {
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(d: DType, x: f64) -> u8 {
        encode_f64(d, x, true)
    }
    fn enc_ns(d: DType, x: f64) -> u8 {
        encode_f64(d, x, false)
    }

    // Expected codes from ml_dtypes 0.5 (the reference behind onnx's Cast / saturate_cast),
    // `np.array([x], np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)` etc.
    #[test]
    fn e4m3fn() {
        let d = DType::F8E4M3FN;
        assert_eq!(enc(d, 0.1), 0x1d); // 0.1015625
        assert_eq!(decode_f64(d, 0x1d), 0.1015625);
        assert_eq!(enc(d, 448.0), 0x7e);
        assert_eq!(enc(d, 464.0), 0x7e); // tie, rounds to even (448)
        assert_eq!(enc_ns(d, 464.0), 0x7e);
        assert_eq!(enc_ns(d, 470.0), 0x7f); // rounds past max: NaN without saturate
        assert_eq!(enc(d, 470.0), 0x7e);
        assert_eq!(enc(d, 1e6), 0x7e);
        assert_eq!(enc(d, -1e6), 0xfe);
        assert_eq!(enc(d, f64::INFINITY), 0x7e);
        assert_eq!(enc_ns(d, f64::INFINITY), 0x7f);
        assert_eq!(enc_ns(d, f64::NEG_INFINITY), 0xff);
        assert_eq!(enc(d, f64::NAN), 0x7f);
        assert_eq!(enc(d, -0.0), 0x80);
        assert_eq!(enc(d, 1e-9), 0x00);
        // Smallest subnormal 2^-9; 0.75 * 2^-9 rounds up to it, 0.5 * 2^-9 ties to 0.
        assert_eq!(enc(d, 0.75 * 2f64.powi(-9)), 0x01);
        assert_eq!(enc(d, 0.5 * 2f64.powi(-9)), 0x00);
        assert!(decode_f64(d, 0x7f).is_nan());
        assert!(decode_f64(d, 0xff).is_nan());
        assert_eq!(decode_f64(d, 0x7e), 448.0);
        assert_eq!(decode_f64(d, 0x01), 2f64.powi(-9));
        assert_eq!(DType::F8E4M3FN.max_finite(), Some(448.0));
    }

    #[test]
    fn e4m3fnuz() {
        let d = DType::F8E4M3FNUZ;
        assert_eq!(enc(d, 0.1), 0x25);
        assert_eq!(enc_ns(d, 448.0), 0x80);
        assert_eq!(enc(d, 448.0), 0x7f); // 240
        assert_eq!(decode_f64(d, 0x7f), 240.0);
        assert_eq!(enc(d, -0.0), 0x00);
        assert_eq!(enc(d, -1e-9), 0x00);
        assert_eq!(enc(d, f64::NAN), 0x80);
        assert!(decode_f64(d, 0x80).is_nan());
        // Smallest subnormal 2^-10.
        assert_eq!(enc(d, 2f64.powi(-10)), 0x01);
        assert_eq!(enc(d, 1.5 * 2f64.powi(-10)), 0x02); // tie 1 / 2 → 2
        assert_eq!(enc(d, 0.5 * 2f64.powi(-10)), 0x00); // tie 0 / 1 → 0
    }

    #[test]
    fn e5m2() {
        let d = DType::F8E5M2;
        assert_eq!(enc(d, 0.1), 0x2e); // 0.09375
        assert_eq!(enc(d, 500.0), 0x60); // 512
        assert_eq!(enc(d, 470.0), 0x5f); // 448
        assert_eq!(enc_ns(d, 1e6), 0x7c);
        assert_eq!(enc_ns(d, f64::NEG_INFINITY), 0xfc);
        assert_eq!(enc(d, 1e6), 0x7b); // 57344
        assert_eq!(decode_f64(d, 0x7b), 57344.0);
        assert_eq!(decode_f64(d, 0x7c), f64::INFINITY);
        assert_eq!(enc(d, f64::NAN), 0x7e);
        assert!(decode_f64(d, 0x7d).is_nan());
        assert_eq!(enc(d, 0.75 * 2f64.powi(-14)), 0x03);
    }

    #[test]
    fn e5m2fnuz() {
        let d = DType::F8E5M2FNUZ;
        assert_eq!(enc(d, 0.1), 0x32);
        assert_eq!(enc(d, 448.0), 0x63);
        assert_eq!(enc_ns(d, 1e6), 0x80);
        assert_eq!(enc(d, 1e6), 0x7f);
        assert_eq!(decode_f64(d, 0x7f), 57344.0);
        assert_eq!(enc(d, 1.5 * 2f64.powi(-10)), 0x1a);
        assert_eq!(enc(d, 0.75 * 2f64.powi(-15)), 0x03);
    }

    #[test]
    fn e2m1() {
        let d = DType::F4E2M1;
        // Codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
        let vals = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for (c, v) in vals.iter().enumerate() {
            assert_eq!(decode_f64(d, c as u8), *v);
            assert_eq!(decode_f64(d, c as u8 | 8), -*v);
            assert_eq!(enc(d, *v), c as u8);
        }
        assert_eq!(enc(d, 0.25), 0x0); // tie 0 / 0.5 → even (0)
        assert_eq!(enc(d, 0.48), 0x1);
        assert_eq!(enc(d, 1.05), 0x2);
        assert_eq!(enc(d, -3.5), 0xe); // tie 3 / 4 → 4
        assert_eq!(enc_ns(d, 1e6), 0x7);
        assert_eq!(enc_ns(d, f64::NEG_INFINITY), 0xf);
        assert_eq!(enc(d, f64::NAN), 0x8);
        assert_eq!(enc(d, -0.0), 0x8);
    }

    // Expected codes from onnx 1.23's `numpy_helper.to_float8e8m0` (the Cast reference) and
    // the suite's test_cast_e8m0_FLOAT_to_FLOAT8E8M0 case.
    #[test]
    fn e8m0() {
        let d = DType::F8E8M0;
        let xs = [0.0, 0.124, 0.25, 0.5, 1.1, 2.0, 4.0, 8.0];
        let want = [0x00, 0x7c, 0x7d, 0x7e, 0x80, 0x80, 0x81, 0x82];
        for (x, w) in xs.iter().zip(want) {
            assert_eq!(enc(d, *x as f32 as f64), w, "{x}");
        }
        assert_eq!(decode_f64(d, 0x00), 2f64.powi(-127));
        assert_eq!(decode_f64(d, 0x7f), 1.0);
        assert_eq!(decode_f64(d, 0x82), 8.0);
        assert!(decode_f64(d, 0xff).is_nan());
        assert_eq!(enc(d, f64::NAN), 0xff);
        assert_eq!(enc(d, f64::NEG_INFINITY), 0xff);
        assert_eq!(enc(d, -2.0), 0x80); // sign dropped
                                        // 1.5 = 1.1b * 2^0: up → 2, down → 1, nearest (guard bit set, lsb 1) → 2;
                                        // 1.25: nearest → 1 (guard bit clear).
        let r = |x: f64, m| encode_e8m0(x, true, m);
        assert_eq!(r(1.5, E8M0Round::Up), 0x80);
        assert_eq!(r(1.5, E8M0Round::Down), 0x7f);
        assert_eq!(r(1.5, E8M0Round::Nearest), 0x80);
        assert_eq!(r(1.25, E8M0Round::Nearest), 0x7f);
        // Bumping past 2^127: saturate keeps 0xFE, otherwise NaN.
        let big = f32::MAX as f64;
        assert_eq!(encode_e8m0(big, true, E8M0Round::Up), 0xfe);
        assert_eq!(encode_e8m0(big, false, E8M0Round::Up), 0xff);
        assert_eq!(DType::F8E8M0.max_finite(), Some(2f64.powi(127)));
    }

    #[test]
    fn small_ints_wrap() {
        // ml_dtypes: [1.5, 2.5, -1.7, 7.9, 8, 9, 20, -9, -20, 300] → int4
        // [1, 2, -1, 7, -8, -7, 4, 7, -4, -4]; NaN and Inf → 0.
        let xs = [1.5, 2.5, -1.7, 7.9, 8.0, 9.0, 20.0, -9.0, -20.0, 300.0];
        let i4 = [1, 2, -1, 7, -8, -7, 4, 7, -4, -4];
        let u4 = [1, 2, 15, 7, 8, 9, 4, 7, 12, 12];
        let i2 = [1, -2, -1, -1, 0, 1, 0, -1, 0, 0];
        for (k, &x) in xs.iter().enumerate() {
            assert_eq!(decode_i64(DType::I4, enc(DType::I4, x)), i4[k], "{x}");
            assert_eq!(decode_i64(DType::U4, enc(DType::U4, x)), u4[k], "{x}");
            assert_eq!(decode_i64(DType::I2, enc(DType::I2, x)), i2[k], "{x}");
        }
        assert_eq!(enc(DType::I4, f64::NAN), 0);
        assert_eq!(enc(DType::U2, f64::INFINITY), 0);
        assert_eq!(encode_i64(DType::I4, 200), 8);
        assert_eq!(decode_i64(DType::I4, 8), -8);
    }
}
