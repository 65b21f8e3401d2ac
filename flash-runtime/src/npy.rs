//! Reading and writing NumPy `.npy` files (format versions 1.0, 2.0 and 3.0), C order only.
//!
//! Accepted element types (`descr`), little-endian or byte-order-free:
//!
//! | descr                          | meaning                                                  |
//! |--------------------------------|----------------------------------------------------------|
//! | `<f2`                          | IEEE half (f16)                                          |
//! | `<V2`, `|V2`, `bfloat16`, `<bf16` | bfloat16 bits. `np.save` of an `ml_dtypes.bfloat16` array writes `'<V2'` (the dtype is not a NumPy builtin); load such a file with `np.load(f).view(ml_dtypes.bfloat16)` |
//! | `<f4`, `<f8`                   | float32, float64                                          |
//! | `<i4`, `<i8`                   | int32, int64                                              |
//! | `|u1`, `<u1`                   | uint8 (dropout keep masks)                                |
//!
//! Written files use version 1.0 (2.0 when the header does not fit), with the header padded so
//! the data starts at a multiple of 64 bytes, as NumPy does. bf16 is written as `'<V2'`.

use std::path::Path;

use crate::error::FlashError;

/// Element data of an array, in C order.
#[derive(Debug, Clone, PartialEq)]
pub enum NpyData {
    /// IEEE half bits (`<f2`), kept as bits so a round trip is exact.
    F16(Vec<u16>),
    /// bfloat16 bits.
    Bf16(Vec<u16>),
    /// float32 (`<f4`).
    F32(Vec<f32>),
    /// float64 (`<f8`).
    F64(Vec<f64>),
    /// int32 (`<i4`).
    I32(Vec<i32>),
    /// int64 (`<i8`).
    I64(Vec<i64>),
    /// uint8 (dropout masks: 1 = kept).
    U8(Vec<u8>),
}

/// An n-dimensional array read from or written to a `.npy` file.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyArray {
    /// Dimensions, outermost first (C order); `[]` is a scalar. Their product is `data.len()`.
    pub shape: Vec<usize>,
    /// The elements in C (row-major) order, typed by the file's `descr`.
    pub data: NpyData,
}

fn bad(msg: impl Into<String>) -> FlashError {
    FlashError::Invalid(msg.into())
}

impl NpyData {
    /// Number of elements (not bytes).
    pub fn len(&self) -> usize {
        match self {
            NpyData::F16(v) | NpyData::Bf16(v) => v.len(),
            NpyData::F32(v) => v.len(),
            NpyData::F64(v) => v.len(),
            NpyData::I32(v) => v.len(),
            NpyData::I64(v) => v.len(),
            NpyData::U8(v) => v.len(),
        }
    }
    /// Whether there are no elements (a shape with a zero dimension).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The `descr` written for this type.
    pub fn descr(&self) -> &'static str {
        match self {
            NpyData::F16(_) => "<f2",
            NpyData::Bf16(_) => "<V2",
            NpyData::F32(_) => "<f4",
            NpyData::F64(_) => "<f8",
            NpyData::I32(_) => "<i4",
            NpyData::I64(_) => "<i8",
            NpyData::U8(_) => "|u1",
        }
    }
    /// Every element as f64 (exact for all accepted types but i64 beyond 2^53).
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            NpyData::F16(v) => v
                .iter()
                .map(|&b| half::f16::from_bits(b).to_f64())
                .collect(),
            NpyData::Bf16(v) => v
                .iter()
                .map(|&b| half::bf16::from_bits(b).to_f64())
                .collect(),
            NpyData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            NpyData::F64(v) => v.clone(),
            NpyData::I32(v) => v.iter().map(|&x| x as f64).collect(),
            NpyData::I64(v) => v.iter().map(|&x| x as f64).collect(),
            NpyData::U8(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }
    /// Elements as f32 (rounded from f64).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            NpyData::F32(v) => v.clone(),
            _ => self.to_f64().iter().map(|&x| x as f32).collect(),
        }
    }
    /// Elements as i32; floats must hold integers and every value must fit.
    pub fn to_i32(&self) -> Result<Vec<i32>, FlashError> {
        let conv = |x: f64| {
            if x.fract() == 0.0 && x >= i32::MIN as f64 && x <= i32::MAX as f64 {
                Ok(x as i32)
            } else {
                Err(bad(format!("{x} is not an i32")))
            }
        };
        match self {
            NpyData::I32(v) => Ok(v.clone()),
            NpyData::I64(v) => v
                .iter()
                .map(|&x| i32::try_from(x).map_err(|_| bad(format!("{x} does not fit an i32"))))
                .collect(),
            _ => self.to_f64().into_iter().map(conv).collect(),
        }
    }
    /// Elements as 16-bit `dtype` bits, rounding to nearest even from wider types; an array
    /// already of that 16-bit type is taken as is, one of the other 16-bit type is converted.
    pub fn to_half_bits(&self, dtype: flash_dsl::DType) -> Vec<u16> {
        match (dtype, self) {
            (flash_dsl::DType::Bf16, NpyData::Bf16(v))
            | (flash_dsl::DType::F16, NpyData::F16(v)) => v.clone(),
            (flash_dsl::DType::Bf16, _) => self
                .to_f64()
                .iter()
                .map(|&x| half::bf16::from_f64(x).to_bits())
                .collect(),
            (flash_dsl::DType::F16, _) => self
                .to_f64()
                .iter()
                .map(|&x| half::f16::from_f64(x).to_bits())
                .collect(),
        }
    }
}

impl NpyArray {
    /// An array of `shape` holding `data`; an error when the shape's element count is not
    /// `data.len()` (or overflows `usize`).
    ///
    /// ```
    /// use flash_runtime::npy::{NpyArray, NpyData};
    ///
    /// let a = NpyArray::new(vec![2, 3], NpyData::F32(vec![0.0; 6])).unwrap();
    /// assert_eq!(a.data.len(), 6);
    /// assert!(NpyArray::new(vec![2, 2], NpyData::F32(vec![0.0; 6])).is_err());
    /// ```
    pub fn new(shape: Vec<usize>, data: NpyData) -> Result<NpyArray, FlashError> {
        let n = elements(&shape)?;
        if n != data.len() {
            return Err(bad(format!(
                "shape {shape:?} has {n} elements; the data has {}",
                data.len()
            )));
        }
        Ok(NpyArray { shape, data })
    }

    /// Parses the bytes of a `.npy` file. Errors ([`FlashError::Invalid`]) for a missing magic,
    /// an unsupported version or element type, Fortran order, and data that is not exactly the
    /// shape's size (short or long).
    pub fn from_bytes(bytes: &[u8]) -> Result<NpyArray, FlashError> {
        if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
            return Err(bad("not a .npy file (no \\x93NUMPY magic)"));
        }
        let major = bytes[6];
        let (hlen, start) = match major {
            1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
            2 | 3 => {
                if bytes.len() < 12 {
                    return Err(bad("truncated .npy header"));
                }
                (
                    u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize,
                    12,
                )
            }
            v => {
                return Err(bad(format!(
                    "unsupported .npy version {v}; 1, 2 and 3 are read"
                )))
            }
        };
        let header = bytes
            .get(start..start + hlen)
            .ok_or_else(|| bad("truncated .npy header"))?;
        let header = std::str::from_utf8(header).map_err(|_| bad("the .npy header is not text"))?;
        let descr = dict_value(header, "descr")?;
        let descr = descr.trim_matches(|c| c == '\'' || c == '"');
        let fortran = dict_value(header, "fortran_order")?;
        if fortran.trim() != "False" {
            return Err(bad(
                "fortran-order .npy files are not supported; save a C-order array",
            ));
        }
        let shape = parse_shape(&dict_value(header, "shape")?)?;
        let n = elements(&shape)?;
        let body = &bytes[start + hlen..];
        // The data must be exactly the shape's bytes: a short file is truncated, a longer one
        // is not the array its header describes.
        let take = |size: usize| -> Result<&[u8], FlashError> {
            let need = n.checked_mul(size).ok_or_else(|| {
                bad(format!(
                    "shape {shape:?} of {size}-byte elements needs more bytes than this machine can address"
                ))
            })?;
            if body.len() != need {
                return Err(bad(format!(
                    "the .npy data holds {} bytes; shape {shape:?} of {size}-byte elements needs exactly {need}",
                    body.len()
                )));
            }
            Ok(body)
        };
        let data = match descr {
            "<f2" => NpyData::F16(chunks(take(2)?, u16::from_le_bytes)),
            "<V2" | "|V2" | "bfloat16" | "<bf16" => NpyData::Bf16(chunks(take(2)?, u16::from_le_bytes)),
            "<f4" => NpyData::F32(chunks(take(4)?, f32::from_le_bytes)),
            "<f8" => NpyData::F64(chunks(take(8)?, f64::from_le_bytes)),
            "<i4" => NpyData::I32(chunks(take(4)?, i32::from_le_bytes)),
            "<i8" => NpyData::I64(chunks(take(8)?, i64::from_le_bytes)),
            "|u1" | "<u1" => NpyData::U8(take(1)?.to_vec()),
            d => {
                return Err(bad(format!(
                    "unsupported .npy element type '{d}'; accepted: <f2, <V2 (bfloat16), <f4, <f8, <i4, <i8, |u1"
                )))
            }
        };
        Ok(NpyArray { shape, data })
    }

    /// The bytes of a `.npy` file holding this array (see the module doc for the header layout);
    /// [`from_bytes`](Self::from_bytes) reads them back unchanged.
    ///
    /// ```
    /// use flash_runtime::npy::{NpyArray, NpyData};
    ///
    /// let a = NpyArray::new(vec![2, 2], NpyData::I64(vec![1, 2, 3, 4])).unwrap();
    /// let bytes = a.to_bytes();
    /// assert_eq!(&bytes[..6], b"\x93NUMPY");
    /// assert_eq!(NpyArray::from_bytes(&bytes).unwrap(), a);
    /// assert!(NpyArray::from_bytes(&bytes[..bytes.len() - 1]).is_err()); // truncated data
    /// ```
    pub fn to_bytes(&self) -> Vec<u8> {
        let shape = match self.shape.len() {
            1 => format!("({},)", self.shape[0]),
            _ => format!(
                "({})",
                self.shape
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let dict = format!(
            "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
            self.data.descr()
        );
        let (major, pre) = if dict.len() + 1 + 10 <= u16::MAX as usize {
            (1u8, 10)
        } else {
            (2u8, 12)
        };
        let hlen = (pre + dict.len() + 1).next_multiple_of(64) - pre;
        let mut out = Vec::with_capacity(pre + hlen + self.data.len() * 8);
        out.extend_from_slice(b"\x93NUMPY");
        out.push(major);
        out.push(0);
        if major == 1 {
            out.extend_from_slice(&(hlen as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&(hlen as u32).to_le_bytes());
        }
        out.extend_from_slice(dict.as_bytes());
        out.resize(pre + hlen - 1, b' ');
        out.push(b'\n');
        match &self.data {
            NpyData::F16(v) | NpyData::Bf16(v) => {
                v.iter().for_each(|x| out.extend(x.to_le_bytes()))
            }
            NpyData::F32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            NpyData::F64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            NpyData::I32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            NpyData::I64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            NpyData::U8(v) => out.extend_from_slice(v),
        }
        out
    }

    /// Reads and parses the `.npy` file at `path`; a parse error's message starts with the path.
    ///
    /// ```
    /// use flash_runtime::npy::{NpyArray, NpyData};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("q.npy");
    /// // bfloat16 bits of 1.0 and -2.0; written as '<V2', as NumPy does for ml_dtypes.bfloat16.
    /// let q = NpyArray::new(vec![1, 2], NpyData::Bf16(vec![0x3f80, 0xc000])).unwrap();
    /// q.write(&path).unwrap();
    /// let back = NpyArray::read(&path).unwrap();
    /// assert_eq!(back, q);
    /// assert_eq!(back.data.to_f64(), vec![1.0, -2.0]);
    /// assert!(NpyArray::read(&dir.path().join("missing.npy")).is_err());
    /// ```
    pub fn read(path: &Path) -> Result<NpyArray, FlashError> {
        let bytes = std::fs::read(path).map_err(|e| FlashError::io("reading", path, e))?;
        NpyArray::from_bytes(&bytes).map_err(|e| bad(format!("{}: {e}", path.display())))
    }

    /// Writes the array to `path` as a `.npy` file ([`to_bytes`](Self::to_bytes)), replacing
    /// any existing file.
    pub fn write(&self, path: &Path) -> Result<(), FlashError> {
        std::fs::write(path, self.to_bytes()).map_err(|e| FlashError::io("writing", path, e))
    }
}

/// The element count of `shape`, or an error naming it when the product overflows.
fn elements(shape: &[usize]) -> Result<usize, FlashError> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            bad(format!(
                "shape {shape:?} has more elements than this machine can address"
            ))
        })
}

fn chunks<const N: usize, T>(b: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
    b.chunks_exact(N)
        .map(|c| f(c.try_into().expect("exact chunk")))
        .collect()
}

/// The raw text of `key`'s value in the header's Python dict literal.
fn dict_value(header: &str, key: &str) -> Result<String, FlashError> {
    let pat1 = format!("'{key}'");
    let pat2 = format!("\"{key}\"");
    let at = header
        .find(&pat1)
        .or_else(|| header.find(&pat2))
        .ok_or_else(|| bad(format!("the .npy header has no '{key}'")))?;
    let rest = &header[at + pat1.len()..];
    let rest = rest
        .trim_start()
        .strip_prefix(':')
        .ok_or_else(|| bad(format!("malformed .npy header near '{key}'")))?
        .trim_start();
    // A value ends at the first top-level comma or closing brace.
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    for (i, c) in rest.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[') => depth += 1,
            (None, ')' | ']') => depth -= 1,
            (None, ',' | '}') if depth == 0 => return Ok(rest[..i].trim().to_string()),
            _ => {}
        }
    }
    Err(bad(format!("malformed .npy header near '{key}'")))
}

fn parse_shape(s: &str) -> Result<Vec<usize>, FlashError> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| bad(format!("malformed .npy shape {s}")))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| bad(format!("malformed .npy shape {s}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(a: &NpyArray) {
        let bytes = a.to_bytes();
        let hdr_end = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
        assert_eq!(hdr_end % 64, 0, "data starts 64-byte aligned");
        assert_eq!(&NpyArray::from_bytes(&bytes).unwrap(), a);
    }

    #[test]
    fn every_type_round_trips() {
        let h = |x: f32| half::f16::from_f32(x).to_bits();
        let b = |x: f32| half::bf16::from_f32(x).to_bits();
        round_trip(
            &NpyArray::new(vec![2, 3], NpyData::F16(vec![h(1.0), h(-2.5), 0, 1, 2, 3])).unwrap(),
        );
        round_trip(&NpyArray::new(vec![3], NpyData::Bf16(vec![b(1.0), b(3.0), b(-0.5)])).unwrap());
        round_trip(
            &NpyArray::new(vec![1, 2, 1, 2], NpyData::F32(vec![1.0, 2.0, 3.0, -4.0])).unwrap(),
        );
        round_trip(&NpyArray::new(vec![2], NpyData::F64(vec![1.5, f64::NEG_INFINITY])).unwrap());
        round_trip(&NpyArray::new(vec![4], NpyData::I32(vec![0, 0, 1, 7])).unwrap());
        round_trip(&NpyArray::new(vec![2, 3], NpyData::U8(vec![0, 1, 1, 0, 1, 0])).unwrap());
        round_trip(&NpyArray::new(vec![1], NpyData::I64(vec![-3])).unwrap());
        round_trip(&NpyArray::new(vec![], NpyData::F32(vec![2.0])).unwrap());
        round_trip(&NpyArray::new(vec![0, 5], NpyData::F32(vec![])).unwrap());
    }

    #[test]
    fn reads_what_numpy_writes() {
        // np.save of np.arange(3, dtype='<i4'), byte for byte (NumPy 1.x/2.x, version 1.0).
        let mut f =
            b"\x93NUMPY\x01\x00v\x00{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }"
                .to_vec();
        f.resize(10 + 118 - 1, b' ');
        f.push(b'\n');
        for x in 0i32..3 {
            f.extend(x.to_le_bytes());
        }
        let a = NpyArray::from_bytes(&f).unwrap();
        assert_eq!(a.shape, vec![3]);
        assert_eq!(a.data, NpyData::I32(vec![0, 1, 2]));
    }

    #[test]
    fn conversions() {
        let a = NpyData::F32(vec![1.0, 2.0, -3.0]);
        assert_eq!(a.to_i32().unwrap(), vec![1, 2, -3]);
        assert!(NpyData::F32(vec![1.5]).to_i32().is_err());
        let bits = a.to_half_bits(flash_dsl::DType::Bf16);
        assert_eq!(half::bf16::from_bits(bits[2]).to_f32(), -3.0);
        let bits = a.to_half_bits(flash_dsl::DType::F16);
        assert_eq!(half::f16::from_bits(bits[1]).to_f32(), 2.0);
    }

    #[test]
    fn rejects_what_it_cannot_read() {
        assert!(NpyArray::from_bytes(b"hello").is_err());
        let a = NpyArray::new(vec![2], NpyData::F32(vec![1.0, 2.0])).unwrap();
        let mut b = a.to_bytes();
        b.truncate(b.len() - 1);
        let e = NpyArray::from_bytes(&b).unwrap_err().to_string();
        assert!(e.contains("needs exactly 8"), "{e}");
        // Trailing bytes: the header does not describe this file.
        let mut long = a.to_bytes();
        long.push(0);
        let e = NpyArray::from_bytes(&long).unwrap_err().to_string();
        assert!(
            e.contains("holds 9 bytes") && e.contains("needs exactly 8"),
            "{e}"
        );
        // A shape whose product overflows is an error, in release and debug alike.
        let bytes = a.to_bytes();
        let at = bytes
            .windows(4)
            .position(|w| w == b"(2,)")
            .expect("the shape");
        let big = b"(4294967296, 4294967296, 4294967296)";
        // Same header length: drop as many of the header's padding spaces (before its '\n').
        let nl = bytes
            .iter()
            .position(|&c| c == b'\n')
            .expect("the header's end");
        let mut huge = bytes[..at].to_vec();
        huge.extend_from_slice(big);
        huge.extend_from_slice(&bytes[at + 4..nl - (big.len() - 4)]);
        huge.extend_from_slice(&bytes[nl..]);
        let e = NpyArray::from_bytes(&huge).unwrap_err().to_string();
        assert!(
            e.contains("more elements than this machine can address"),
            "{e}"
        );
        assert!(NpyArray::new(vec![usize::MAX, 2], NpyData::U8(vec![])).is_err());
        let c = String::from_utf8_lossy(&a.to_bytes()).replace("False", "True ");
        assert!(NpyArray::from_bytes(c.as_bytes()).is_err());
    }
}
