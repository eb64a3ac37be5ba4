//! Writing NumPy `.npy` files (format version 1.0, `<f4`, C order), as
//! specified in `numpy/lib/format.py`: the magic `\x93NUMPY`, version bytes
//! `1 0`, a little-endian u16 header length, then an ASCII dict literal padded
//! with spaces and ending in `\n` so the data starts at a multiple of 64
//! bytes, then the raw little-endian data.

use std::io::Write;

/// Serialises `data` with `shape` (row-major) as an `.npy` byte stream.
pub fn write_f32(mut w: impl Write, shape: &[usize], data: &[f32]) -> std::io::Result<()> {
    let n: usize = shape.iter().product();
    if n != data.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("shape {shape:?} holds {n} values, data has {}", data.len()),
        ));
    }
    let dims = match shape {
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {dims}, }}");
    // magic (6) + version (2) + length (2) + header + '\n' ≡ 0 (mod 64)
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let len = u16::try_from(header.len()).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "npy header too long")
    })?;
    w.write_all(b"\x93NUMPY\x01\x00")?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(header.as_bytes())?;
    let mut bytes = Vec::with_capacity(data.len() * 4);
    for v in data {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    w.write_all(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_aligned_and_data_follows() {
        let mut out = Vec::new();
        write_f32(&mut out, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        assert_eq!(&out[..8], b"\x93NUMPY\x01\x00");
        let hlen = u16::from_le_bytes([out[8], out[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let header = std::str::from_utf8(&out[10..10 + hlen]).unwrap();
        assert!(header.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"));
        assert!(header.ends_with('\n'));
        assert_eq!(out.len(), 10 + hlen + 24);
        assert_eq!(&out[10 + hlen..10 + hlen + 4], &1f32.to_le_bytes());
        assert!(write_f32(&mut Vec::new(), &[2], &[1.0]).is_err());
    }
}
