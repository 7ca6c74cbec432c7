//! Tensor data between JSON and bytes: JSON elements to little-endian bytes of a
//! datatype and back, FP16 conversions, the shape's text in messages, and the
//! binary tensor extension's header.

use super::request::budget::take_elem;
use crate::repo::{bytes_of_slot, DType};
use serde_json::{json, Value};

/// The binary tensor extension's header: the length of the JSON part of a body.
pub const HEADER_LEN: &str = "inference-header-content-length";

/// A shape as messages write it: `[1, 2, 3]`.
pub(super) fn shape_text(s: &[i64]) -> String {
    format!(
        "[{}]",
        s.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// A tensor's JSON `data`, flattened in row-major order while it is parsed.
///
/// Written by hand on the request path: parsing `data` into a `serde_json::Value`
/// first built a tree of 32-byte values and one vector per nested array before
/// any element was converted; this keeps one 16-byte [`Elem`] per element and
/// nothing else (nesting costs no stack: the scan is a loop, and it is
/// bounded as serde_json bounds the rest of the request). Inside
/// a request's parse each element comes from its budget
/// ([`super::request::budget`]), and an object among the elements is kept as
/// a placeholder, not as a tree.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct JsonElems {
    pub elems: Vec<Elem>,
    /// Elements that are neither numbers nor booleans, whole, for error messages.
    pub odd: Vec<Value>,
}

/// One element of a JSON `data` array, as JSON typed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Elem {
    Bool(bool),
    /// A non-negative integer.
    U(u64),
    /// A negative integer.
    I(i64),
    F(f64),
    /// `odd[k]` of its [`JsonElems`]: a string, null or object.
    Odd(u32),
}

impl Elem {
    fn as_u64(self) -> Option<u64> {
        match self {
            Elem::U(u) => Some(u),
            _ => None,
        }
    }
    fn as_i64(self) -> Option<i64> {
        match self {
            Elem::U(u) => i64::try_from(u).ok(),
            Elem::I(i) => Some(i),
            _ => None,
        }
    }
    fn as_f64(self) -> Option<f64> {
        match self {
            Elem::U(u) => Some(u as f64),
            Elem::I(i) => Some(i as f64),
            Elem::F(f) => Some(f),
            _ => None,
        }
    }
}

impl JsonElems {
    /// Element `e` as JSON, for messages.
    pub fn shown(&self, e: Elem) -> Value {
        match e {
            Elem::Bool(b) => Value::Bool(b),
            Elem::U(u) => json!(u),
            Elem::I(i) => json!(i),
            Elem::F(f) => json!(f),
            Elem::Odd(k) => self.odd.get(k as usize).cloned().unwrap_or(Value::Null),
        }
    }
    /// Element `e`'s text when it is a JSON string (borrowed, not copied).
    pub fn as_str(&self, e: Elem) -> Option<&str> {
        match e {
            Elem::Odd(k) => self.odd.get(k as usize)?.as_str(),
            _ => None,
        }
    }
    fn push_odd(&mut self, v: Value) {
        self.elems.push(Elem::Odd(self.odd.len() as u32));
        self.odd.push(v);
    }
}

impl<'de> serde::Deserialize<'de> for JsonElems {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // serde_json checks the value's syntax while it skips over it (without
        // converting a number); the text is then read by `scan`.
        let raw: &'de serde_json::value::RawValue = serde::Deserialize::deserialize(d)?;
        let mut out = JsonElems::default();
        scan(raw.get().as_bytes(), &mut out)?;
        Ok(out)
    }
}

/// The most levels of arrays a tensor's `data` may nest: serde_json's limit
/// for a whole document (128) less the request's own three levels around
/// `data` (its object, `inputs` and the tensor's object), so that a request is
/// held to one limit however its levels fall.
const DATA_DEPTH_MAX: usize = 125;

/// Appends every element of one JSON value's text (nested arrays flattened in
/// row-major order) to `out`, each from the request's budget.
///
/// Written by hand for the hot path: a tensor's `data` is mostly numbers, and
/// serde_json's exact float conversion (`float_roundtrip`, kept for the rest of
/// the request) took about 70% of an HTTP worker's time on FP32 requests; see
/// [`read_number`] for what is done instead (exact as well). Each number is
/// typed as serde_json types it: an integer without a fraction or exponent is a
/// `u64`, or an `i64` when negative, and a float past either (and `-0`, as
/// -0.0); a float that overflows is an error. Strings, nulls and objects (only
/// ever in a request that is refused) are read by serde_json.
fn scan<E: serde::de::Error>(t: &[u8], out: &mut JsonElems) -> Result<(), E> {
    let mut i = 0;
    let mut depth = 0usize;
    while i < t.len() {
        match t[i] {
            b' ' | b'\t' | b'\n' | b'\r' | b',' => i += 1,
            b'[' => {
                depth += 1;
                if depth > DATA_DEPTH_MAX {
                    // Worded as serde_json words its own limit (the request's
                    // parse names it).
                    return Err(E::custom("recursion limit exceeded"));
                }
                i += 1;
            }
            b']' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                take_elem()?;
                let (e, end) = read_number(t, i)?;
                out.elems.push(e);
                i = end;
            }
            b't' if t[i..].starts_with(b"true") => {
                take_elem()?;
                out.elems.push(Elem::Bool(true));
                i += 4;
            }
            b'f' if t[i..].starts_with(b"false") => {
                take_elem()?;
                out.elems.push(Elem::Bool(false));
                i += 5;
            }
            b'n' if t[i..].starts_with(b"null") => {
                take_elem()?;
                out.push_odd(Value::Null);
                i += 4;
            }
            b'"' => {
                take_elem()?;
                let mut it = serde_json::Deserializer::from_slice(&t[i..]).into_iter::<String>();
                let s = it.next().ok_or_else(|| E::custom("a string ends early"))?;
                out.push_odd(Value::String(s.map_err(E::custom)?));
                i += it.byte_offset();
            }
            b'{' => {
                take_elem()?;
                let mut it = serde_json::Deserializer::from_slice(&t[i..])
                    .into_iter::<serde::de::IgnoredAny>();
                it.next()
                    .ok_or_else(|| E::custom("an object ends early"))?
                    .map_err(E::custom)?;
                out.push_odd(Value::String("(an object)".into()));
                i += it.byte_offset();
            }
            c => {
                return Err(E::custom(format!(
                    "unexpected character {:?} in tensor data",
                    c as char
                )))
            }
        }
    }
    Ok(())
}

/// The JSON number at `t[start..]` (checked by serde_json) and where it ends.
///
/// An integer (no fraction, no exponent) is accumulated here, exactly; a float,
/// and an integer past 64 bits, is converted by `fast-float2` (Eisel-Lemire,
/// correctly rounded like serde_json's `float_roundtrip`), in one pass over
/// its bytes.
fn read_number<E: serde::de::Error>(t: &[u8], start: usize) -> Result<(Elem, usize), E> {
    let neg = t.get(start) == Some(&b'-');
    let mut j = start + usize::from(neg);
    let mut m: u64 = 0;
    let mut fits = true;
    while let Some(&c) = t.get(j) {
        if !c.is_ascii_digit() {
            break;
        }
        match m
            .checked_mul(10)
            .and_then(|x| x.checked_add(u64::from(c - b'0')))
        {
            Some(x) => m = x,
            None => fits = false,
        }
        j += 1;
    }
    if !matches!(t.get(j), Some(b'.' | b'e' | b'E')) {
        let e = match (neg, m) {
            // serde_json: an integer past 64 bits is a float.
            _ if !fits => finite(&t[start..j], fast_float2::parse(&t[start..j]))?,
            (false, m) => Elem::U(m),
            // serde_json: `-0` is -0.0, a negative beyond i64 a float.
            (true, 0) => Elem::F(-0.0),
            (true, m) => match i64::try_from(m) {
                Ok(v) => Elem::I(-v),
                Err(_) if m == 1 << 63 => Elem::I(i64::MIN),
                Err(_) => Elem::F(-(m as f64)),
            },
        };
        return Ok((e, j));
    }
    match fast_float2::parse_partial::<f64, _>(&t[start..]) {
        Ok((x, n)) => Ok((finite(&t[start..start + n], Ok(x))?, start + n)),
        Err(_) => Err(E::custom(format!(
            "invalid number at {:?}",
            String::from_utf8_lossy(&t[start..t.len().min(start + 32)])
        ))),
    }
}

/// A number's conversion as serde_json takes it: a float that overflows (to an
/// infinity) is an error.
fn finite<E: serde::de::Error>(text: &[u8], x: Result<f64, fast_float2::Error>) -> Result<Elem, E> {
    let text = || String::from_utf8_lossy(text);
    match x {
        Ok(f) if f.is_finite() => Ok(Elem::F(f)),
        Ok(_) => Err(E::custom(format!("number out of range: {}", text()))),
        Err(_) => Err(E::custom(format!("invalid number: {}", text()))),
    }
}

/// Appends one element's little-endian bytes; None when it is not a `dt`
/// (the same rules as `serde_json::Value`'s `as_bool`, `as_u64`, `as_i64` and
/// `as_f64`: an integer type takes integers only, a float type any number).
pub(super) fn encode_elem(dt: DType, e: Elem, out: &mut Vec<u8>) -> Option<()> {
    match dt {
        DType::Bool => match e {
            Elem::Bool(b) => out.push(b as u8),
            _ => return None,
        },
        DType::U8 => out.push(u8::try_from(e.as_u64()?).ok()?),
        DType::U16 => out.extend_from_slice(&u16::try_from(e.as_u64()?).ok()?.to_le_bytes()),
        DType::U32 => out.extend_from_slice(&u32::try_from(e.as_u64()?).ok()?.to_le_bytes()),
        DType::U64 => out.extend_from_slice(&e.as_u64()?.to_le_bytes()),
        DType::I8 => out.extend_from_slice(&i8::try_from(e.as_i64()?).ok()?.to_le_bytes()),
        DType::I16 => out.extend_from_slice(&i16::try_from(e.as_i64()?).ok()?.to_le_bytes()),
        DType::I32 => out.extend_from_slice(&i32::try_from(e.as_i64()?).ok()?.to_le_bytes()),
        DType::I64 => out.extend_from_slice(&e.as_i64()?.to_le_bytes()),
        DType::F16 => out.extend_from_slice(&f32_to_f16(e.as_f64()? as f32).to_le_bytes()),
        DType::BF16 => {
            out.extend_from_slice(&half::bf16::from_f64(e.as_f64()?).to_bits().to_le_bytes())
        }
        DType::F32 => out.extend_from_slice(&(e.as_f64()? as f32).to_le_bytes()),
        DType::F64 => out.extend_from_slice(&e.as_f64()?.to_le_bytes()),
        // Strings are kept apart from numbers (`JsonElems::odd`): the request
        // decoder encodes them (`push_bytes_slot`).
        DType::Bytes => return None,
    }
    Some(())
}

/// A tensor's elements (little-endian bytes of `dt`) as JSON values.
pub fn decode_elems(dt: DType, b: &[u8]) -> Vec<Value> {
    let n = dt.size();
    b.chunks_exact(n)
        .map(|c| match dt {
            DType::Bool => Value::Bool(c[0] != 0),
            DType::U8 => json!(c[0]),
            DType::U16 => json!(u16::from_le_bytes(c.try_into().expect("2 bytes"))),
            DType::U32 => json!(u32::from_le_bytes(c.try_into().expect("4 bytes"))),
            DType::U64 => json!(u64::from_le_bytes(c.try_into().expect("8 bytes"))),
            DType::I8 => json!(c[0] as i8),
            DType::I16 => json!(i16::from_le_bytes(c.try_into().expect("2 bytes"))),
            DType::I32 => json!(i32::from_le_bytes(c.try_into().expect("4 bytes"))),
            DType::I64 => json!(i64::from_le_bytes(c.try_into().expect("8 bytes"))),
            DType::F16 => json!(f16_to_f32(u16::from_le_bytes(
                c.try_into().expect("2 bytes")
            ))),
            DType::BF16 => json!(half::bf16::from_bits(u16::from_le_bytes(
                c.try_into().expect("2 bytes")
            ))
            .to_f32()),
            DType::F32 => json!(f32::from_le_bytes(c.try_into().expect("4 bytes"))),
            DType::F64 => json!(f64::from_le_bytes(c.try_into().expect("8 bytes"))),
            DType::Bytes => Value::String(String::from_utf8_lossy(bytes_of_slot(c)).into_owned()),
        })
        .collect()
}

/// IEEE 754 binary32 to binary16 bits, rounding to nearest even (the `half` crate,
/// which ONNX Runtime's FP16 tensors use too).
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// IEEE 754 binary16 bits to binary32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `data` parsed straight into elements: nested arrays flatten row-major,
    /// numbers keep their JSON kind, other values are kept for messages, and the
    /// conversion rules are `serde_json::Value`'s.
    #[test]
    fn json_data_flattens_and_converts_like_values() {
        let d: JsonElems =
            serde_json::from_str(r#"[[1, -2], [3.5, true], ["x", null, {"a": 1}]]"#).unwrap();
        assert_eq!(
            d.elems,
            vec![
                Elem::U(1),
                Elem::I(-2),
                Elem::F(3.5),
                Elem::Bool(true),
                Elem::Odd(0),
                Elem::Odd(1),
                Elem::Odd(2)
            ]
        );
        // An object is not kept as a tree: a placeholder names it.
        assert_eq!(d.shown(d.elems[6]), json!("(an object)"));
        assert_eq!(d.shown(d.elems[2]), json!(3.5));
        let scalar: JsonElems = serde_json::from_str("7").unwrap();
        assert_eq!(scalar.elems, vec![Elem::U(7)]);
        // Against serde_json::Value for every datatype and a spread of elements.
        let cases = r#"[0, 1, 255, 256, -1, -129, 127, 2147483648, -2147483649,
            9223372036854775807, 18446744073709551615, -9223372036854775808,
            0.5, -0.0, 1e300, 65504.0, true, false, "1", null, [], {}]"#;
        let values: Vec<Value> = serde_json::from_str(cases).unwrap();
        for v in &values {
            let text = v.to_string();
            let d: JsonElems = serde_json::from_str(&format!("[{text}]")).unwrap();
            if matches!(v, Value::Array(_)) {
                assert!(d.elems.is_empty());
                continue;
            }
            let e = d.elems[0];
            for dt in [
                DType::Bool,
                DType::U8,
                DType::I8,
                DType::I32,
                DType::I64,
                DType::F16,
                DType::F32,
                DType::F64,
            ] {
                let mut ours = Vec::new();
                let got = encode_elem(dt, e, &mut ours).map(|()| ours);
                let want = value_bytes(dt, v);
                assert_eq!(got, want, "{text} as {dt:?}");
            }
        }
    }

    /// The hand-written scan reads every number as serde_json does (its own
    /// parser, into `Value`, is the reference): random texts of integers at
    /// and past the 64-bit bounds, floats in every notation, nesting and
    /// whitespace; an overflowing float is an error, as in serde_json.
    #[test]
    fn the_scan_reads_numbers_as_serde_json_does() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(13);
        let fixed = [
            "0",
            "-0",
            "-0.0",
            "0.0",
            "1",
            "-1",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
            "-18446744073709551617",
            "1e0",
            "1E+2",
            "-2.5e-3",
            "0.1",
            "123456789012345678901234567890",
            "4.9e-324",
            "2.2250738585072014e-308",
            "1.7976931348623157e308",
            "0.30000000000000004",
            "3.4028235e38",
            "1e-400",
            "-1e-400",
            "true",
            "false",
            "1e22",
            "1e23",
            "-1e-22",
            "9007199254740991e22",
            "9007199254740993e-22",
            "9007199254740992.5",
            "0.0000000000000000000001",
            "1234567890123456789",
            "12345678901234567890",
            "0.1234567890123456789",
            "123.456e-3",
            "1E-0",
            "-9223372036854775807",
        ];
        let mut texts: Vec<String> = fixed.iter().map(|s| format!("[{s}]")).collect();
        for _ in 0..2000 {
            let n = rng.gen_range(1..20);
            let mut parts = Vec::new();
            for _ in 0..n {
                let x: f64 = match rng.gen_range(0..5) {
                    0 => rng.gen::<f32>() as f64,
                    1 => rng.gen::<f64>() * 10f64.powi(rng.gen_range(-300..300)),
                    2 => -(rng.gen::<u64>() as f64),
                    3 => rng.gen_range(-1000i64..1000) as f64,
                    _ => f64::from_bits(
                        rng.gen::<u64>() & !(0x7ff << 52) | (rng.gen_range(1..2046u64) << 52),
                    ),
                };
                if !(x.is_finite() && (x as f32).is_finite()) {
                    continue;
                }
                let t = match rng.gen_range(0..4) {
                    0 => format!("{x}"),
                    1 => format!("{x:e}"),
                    2 => format!("{:E}", x as f32),
                    _ => format!("{}", rng.gen::<i64>()),
                };
                let t = if rng.gen_bool(0.2) {
                    format!(" [ {t} ]\n")
                } else {
                    t
                };
                parts.push(t);
            }
            texts.push(format!("[{}]", parts.join(",")));
        }
        fn flat(v: &Value, out: &mut Vec<Elem>) {
            match v {
                Value::Array(a) => a.iter().for_each(|x| flat(x, out)),
                Value::Bool(b) => out.push(Elem::Bool(*b)),
                Value::Number(n) => out.push(if let Some(u) = n.as_u64() {
                    Elem::U(u)
                } else if let Some(i) = n.as_i64() {
                    Elem::I(i)
                } else {
                    Elem::F(n.as_f64().unwrap())
                }),
                _ => unreachable!(),
            }
        }
        for t in &texts {
            let v: Value = serde_json::from_str(t).unwrap_or_else(|e| panic!("{t}: {e}"));
            let mut want = Vec::new();
            flat(&v, &mut want);
            let got: JsonElems = serde_json::from_str(t).unwrap_or_else(|e| panic!("{t}: {e}"));
            // Bit-exact (-0.0 against 0.0 included).
            let bits = |e: &[Elem]| -> Vec<String> {
                e.iter()
                    .map(|x| match x {
                        Elem::F(f) => format!("F{:x}", f.to_bits()),
                        o => format!("{o:?}"),
                    })
                    .collect()
            };
            assert_eq!(bits(&got.elems), bits(&want), "{t}");
        }
        for t in ["[1e400]", "[-1e309]"] {
            assert!(serde_json::from_str::<Value>(t).is_err());
            let e = serde_json::from_str::<JsonElems>(t)
                .unwrap_err()
                .to_string();
            assert!(e.contains("out of range"), "{t}: {e}");
        }
    }

    /// The conversion as it was written on `serde_json::Value`.
    fn value_bytes(dt: DType, v: &Value) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        match dt {
            DType::Bool => out.push(v.as_bool()? as u8),
            DType::U8 => out.push(u8::try_from(v.as_u64()?).ok()?),
            DType::I8 => out.extend_from_slice(&i8::try_from(v.as_i64()?).ok()?.to_le_bytes()),
            DType::I32 => out.extend_from_slice(&i32::try_from(v.as_i64()?).ok()?.to_le_bytes()),
            DType::I64 => out.extend_from_slice(&v.as_i64()?.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f32_to_f16(v.as_f64()? as f32).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&(v.as_f64()? as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&v.as_f64()?.to_le_bytes()),
            other => unreachable!("the reference predates {other:?}"),
        }
        Some(out)
    }

    #[test]
    fn wider_integers_and_bfloat16_round_trip_and_refuse_what_does_not_fit() {
        let elems = |text: &str| serde_json::from_str::<JsonElems>(text).unwrap();
        for (dt, ok, bad) in [
            (DType::U16, "[0, 65535, 7]", "[65536]"),
            (DType::U32, "[0, 4294967295]", "[-1]"),
            (DType::U64, "[0, 18446744073709551615]", "[-1]"),
            (DType::I16, "[-32768, 32767]", "[40000]"),
        ] {
            let v = elems(ok);
            let mut b = Vec::new();
            for &e in &v.elems {
                encode_elem(dt, e, &mut b).unwrap_or_else(|| panic!("{dt:?} {ok}"));
            }
            assert_eq!(b.len(), v.elems.len() * dt.size());
            let back = Value::Array(decode_elems(dt, &b));
            assert_eq!(back, serde_json::from_str::<Value>(ok).unwrap(), "{dt:?}");
            let e = elems(bad).elems[0];
            assert!(
                encode_elem(dt, e, &mut Vec::new()).is_none(),
                "{dt:?} {bad}"
            );
        }
        // BF16 keeps 8 bits of mantissa: 1.5 and -2.0 exactly, 0.1 nearly.
        let mut b = Vec::new();
        for &e in &elems("[1.5, -2.0, 0.1]").elems {
            encode_elem(DType::BF16, e, &mut b).unwrap();
        }
        assert_eq!(&b[..2], &0x3fc0u16.to_le_bytes());
        let back = decode_elems(DType::BF16, &b);
        assert_eq!(back[0], json!(1.5));
        assert_eq!(back[1], json!(-2.0));
        assert!((back[2].as_f64().unwrap() - 0.1).abs() < 1e-3);
    }

    #[test]
    fn half_floats_round_trip() {
        for x in [
            0.0f32,
            -0.0,
            1.0,
            -2.5,
            65504.0,
            6.1035156e-5,
            5.9604645e-8,
            0.333333,
        ] {
            let h = f32_to_f16(x);
            let y = f16_to_f32(h);
            assert!((x - y).abs() <= x.abs() * 1e-3, "{x} -> {h:#x} -> {y}");
        }
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(f32::INFINITY), 0x7c00);
        assert_eq!(f32_to_f16(1e6), 0x7c00);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        assert_eq!(f32_to_f16(1e-9), 0);
    }
}
