//! GGUF writer: the layout [`crate::gguf`] reads (version 3, little-endian,
//! data section aligned to [`DEFAULT_ALIGNMENT`], each tensor's data padded
//! to it), written without holding tensor data in memory.
//!
//! Every tensor is declared up front (name, row-major shape, format), so the
//! header and each tensor's offset are known before any data: tensor bytes
//! may then be written in any order and in pieces ([`GgufWriter::write_at`]),
//! which lets a caller fill a stacked expert tensor `[n_expert, rows, cols]`
//! one expert at a time. The file is written under a temporary name and
//! renamed into place by [`GgufWriter::finish`] once every byte of every
//! tensor has been written, so a failed write leaves nothing at the path.

use crate::error::{FormatError, IoContext};
use crate::gguf::{GgufArray, GgufValue, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use turbospark_core::QuantFormat;

/// A tensor to declare: its name, row-major shape (outermost first) and
/// format.
#[derive(Debug, Clone)]
pub struct GgufTensorDecl {
    pub name: String,
    pub shape: Vec<u64>,
    pub format: QuantFormat,
}

struct Placed {
    decl: GgufTensorDecl,
    /// Absolute file offset of the tensor's first byte.
    at: u64,
    len: u64,
    written: u64,
}

/// A GGUF file being written (see the module docs).
pub struct GgufWriter {
    path: PathBuf,
    tmp: PathBuf,
    file: File,
    tensors: Vec<Placed>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_array(out: &mut Vec<u8>, a: &GgufArray) {
    out.extend(a.elem_type().id().to_le_bytes());
    out.extend((a.len() as u64).to_le_bytes());
    match a {
        GgufArray::U8(v) => out.extend(v),
        GgufArray::I8(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::U16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::I16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::U32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::I32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::F32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::Bool(v) => v.iter().for_each(|&x| out.push(u8::from(x))),
        GgufArray::String(v) => v.iter().for_each(|s| put_str(out, s)),
        GgufArray::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
        GgufArray::U64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::I64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::F64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
    }
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    out.extend(v.value_type().id().to_le_bytes());
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend(x.to_le_bytes()),
        GgufValue::U16(x) => out.extend(x.to_le_bytes()),
        GgufValue::I16(x) => out.extend(x.to_le_bytes()),
        GgufValue::U32(x) => out.extend(x.to_le_bytes()),
        GgufValue::I32(x) => out.extend(x.to_le_bytes()),
        GgufValue::F32(x) => out.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::Array(a) => put_array(out, a),
        GgufValue::U64(x) => out.extend(x.to_le_bytes()),
        GgufValue::I64(x) => out.extend(x.to_le_bytes()),
        GgufValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}

fn bad(tensor: &str, detail: impl Into<String>) -> FormatError {
    FormatError::BadTensor {
        tensor: tensor.to_string(),
        detail: detail.into(),
    }
}

impl GgufWriter {
    /// Writes the header (metadata in the given order, then the tensor
    /// table) of a GGUF file at `path`; `force` replaces an existing file.
    pub fn create(
        path: &Path,
        metadata: &[(String, GgufValue)],
        tensors: Vec<GgufTensorDecl>,
        force: bool,
    ) -> Result<GgufWriter, FormatError> {
        if path.exists() && !force {
            return Err(FormatError::DestinationExists {
                path: path.to_path_buf(),
            });
        }
        let align = DEFAULT_ALIGNMENT;
        let mut placed = Vec::with_capacity(tensors.len());
        let mut offset = 0u64;
        for decl in tensors {
            let elems: u64 = decl.shape.iter().product();
            let rows_whole = decl
                .shape
                .last()
                .is_some_and(|&c| c % decl.format.block_elems() as u64 == 0);
            let len = decl
                .format
                .bytes_for(elems)
                .filter(|_| rows_whole)
                .ok_or_else(|| {
                    bad(
                        &decl.name,
                        format!(
                            "shape {:?} is not whole {} blocks per row",
                            decl.shape, decl.format
                        ),
                    )
                })?;
            placed.push(Placed {
                decl,
                at: offset,
                len,
                written: 0,
            });
            offset = (offset + len).div_ceil(align) * align;
        }

        let mut head = Vec::new();
        head.extend(GGUF_MAGIC);
        head.extend(3u32.to_le_bytes());
        head.extend((placed.len() as u64).to_le_bytes());
        head.extend((metadata.len() as u64).to_le_bytes());
        for (key, value) in metadata {
            put_str(&mut head, key);
            put_value(&mut head, value);
        }
        for p in &placed {
            put_str(&mut head, &p.decl.name);
            head.extend((p.decl.shape.len() as u32).to_le_bytes());
            // ne[0] is the innermost dimension: the shape reversed.
            for d in p.decl.shape.iter().rev() {
                head.extend(d.to_le_bytes());
            }
            head.extend(p.decl.format.ggml_type().to_le_bytes());
            head.extend(p.at.to_le_bytes());
        }
        let data_start = (head.len() as u64).div_ceil(align) * align;
        head.resize(data_start as usize, 0);
        for p in &mut placed {
            p.at += data_start;
        }

        let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(".partial");
        let tmp = path.with_file_name(tmp_name);
        let file = File::create(&tmp).at(&tmp)?;
        let mut w = BufWriter::new(&file);
        w.write_all(&head).at(&tmp)?;
        w.flush().at(&tmp)?;
        drop(w);
        // The data section, padding included, as a sparse file to fill in.
        file.set_len(data_start + offset).at(&tmp)?;
        Ok(GgufWriter {
            path: path.to_path_buf(),
            tmp,
            file,
            tensors: placed,
        })
    }

    /// Writes `data` at byte `offset` of tensor `name`'s data. Pieces must
    /// not overlap; together they must cover the tensor exactly once.
    pub fn write_at(&mut self, name: &str, offset: u64, data: &[u8]) -> Result<(), FormatError> {
        let p = self
            .tensors
            .iter_mut()
            .find(|p| p.decl.name == name)
            .ok_or_else(|| bad(name, "was not declared in the GGUF header"))?;
        let end = offset + data.len() as u64;
        if end > p.len {
            return Err(bad(
                name,
                format!("bytes {offset}..{end} exceed its {} bytes", p.len),
            ));
        }
        self.file.write_all_at(data, p.at + offset).at(&self.tmp)?;
        p.written += data.len() as u64;
        Ok(())
    }

    /// Writes the whole of tensor `name`'s data.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<(), FormatError> {
        let len = self.tensor_len(name)?;
        if data.len() as u64 != len {
            return Err(bad(
                name,
                format!("has {} bytes of data, expected {len}", data.len()),
            ));
        }
        self.write_at(name, 0, data)
    }

    /// Bytes of tensor `name`'s data.
    pub fn tensor_len(&self, name: &str) -> Result<u64, FormatError> {
        self.tensors
            .iter()
            .find(|p| p.decl.name == name)
            .map(|p| p.len)
            .ok_or_else(|| bad(name, "was not declared in the GGUF header"))
    }

    /// Checks every tensor was written in full, syncs and renames the file
    /// into place.
    pub fn finish(self) -> Result<(), FormatError> {
        if let Some(p) = self.tensors.iter().find(|p| p.written != p.len) {
            let err = bad(
                &p.decl.name,
                format!("{} of its {} bytes were written", p.written, p.len),
            );
            let _ = std::fs::remove_file(&self.tmp);
            return Err(err);
        }
        self.file.sync_all().at(&self.tmp)?;
        std::fs::rename(&self.tmp, &self.path).at(&self.path)
    }
}

impl Drop for GgufWriter {
    fn drop(&mut self) {
        // After finish the temporary name no longer exists.
        let _ = std::fs::remove_file(&self.tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;

    fn tmp(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("ts-gguf-writer-{tag}-{}.gguf", std::process::id()))
    }

    #[test]
    fn round_trips_through_the_reader_in_any_write_order() {
        let path = tmp("rt");
        let meta = vec![
            (
                "general.architecture".to_string(),
                GgufValue::String("llama".into()),
            ),
            ("llama.block_count".to_string(), GgufValue::U32(2)),
            (
                "tokenizer.ggml.tokens".to_string(),
                GgufValue::Array(GgufArray::String(vec!["a".into(), "b".into()])),
            ),
        ];
        let decls = vec![
            GgufTensorDecl {
                name: "a".into(),
                shape: vec![3, 2],
                format: QuantFormat::F32,
            },
            GgufTensorDecl {
                name: "b".into(),
                shape: vec![2, 32],
                format: QuantFormat::Q8_0,
            },
        ];
        let mut w = GgufWriter::create(&path, &meta, decls, true).unwrap();
        let b: Vec<u8> = (0..68).collect();
        w.write_at("b", 34, &b[34..]).unwrap();
        w.write_at("b", 0, &b[..34]).unwrap();
        let a: Vec<u8> = (100..124).collect();
        w.write_tensor("a", &a).unwrap();
        w.finish().unwrap();

        let g = GgufFile::open(&path).unwrap();
        assert_eq!(
            g.get("llama.block_count").and_then(GgufValue::as_u64),
            Some(2)
        );
        let ta = g.tensor("a").unwrap();
        assert_eq!(ta.shape(), [3, 2]);
        assert_eq!(g.tensor_bytes(ta), &a[..]);
        let tb = g.tensor("b").unwrap();
        assert_eq!(tb.shape(), [2, 32]);
        assert_eq!(tb.ggml_type, QuantFormat::Q8_0.ggml_type());
        assert_eq!(g.tensor_bytes(tb), &b[..]);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn incomplete_or_misfit_data_is_an_error_and_leaves_no_file() {
        let path = tmp("bad");
        let _ = std::fs::remove_file(&path);
        let decls = || {
            vec![GgufTensorDecl {
                name: "t".into(),
                shape: vec![4],
                format: QuantFormat::F32,
            }]
        };
        let mut w = GgufWriter::create(&path, &[], decls(), false).unwrap();
        assert!(w.write_tensor("t", &[0; 15]).is_err());
        assert!(w.write_at("t", 8, &[0; 9]).is_err());
        assert!(w.write_at("u", 0, &[0; 4]).is_err());
        w.write_at("t", 0, &[0; 8]).unwrap();
        let err = w.finish().unwrap_err().to_string();
        assert!(err.contains("8 of its 16 bytes"), "{err}");
        assert!(!path.exists());

        let q = vec![GgufTensorDecl {
            name: "q".into(),
            shape: vec![2, 31],
            format: QuantFormat::Q8_0,
        }];
        let err = GgufWriter::create(&path, &[], q, false)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("whole q8_0 blocks"), "{err}");
    }
}
