//! A control vector written by llama.cpp's own `llama-cvector-generator`
//! (SmolLM2-135M, `--method mean`) read by [`ControlVector::read_gguf`],
//! against an independent reading of the same file by the `gguf` Python
//! package of the same llama.cpp (both made by
//! `scripts/llamacpp/make_cvector_reference.sh`): the same layers, in the
//! same count as the file's `controlvector.layer_count`, and the same
//! directions to the bit. llama.cpp's mean method writes unit vectors,
//! which the directions are.

use std::path::{Path, PathBuf};
use turbospark_engine::ControlVector;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference/llamacpp/cvector")
}

/// A little-endian f32 `.npy` file of two dimensions: `(shape, values)`.
fn read_npy_f32(path: &Path) -> ([usize; 2], Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY", "{}", path.display());
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
    };
    let header = std::str::from_utf8(&bytes[start..start + header_len]).unwrap();
    assert!(header.contains("'descr': '<f4'"), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let shape = header.split("'shape': (").nth(1).unwrap();
    let dims: Vec<usize> = shape
        .split(')')
        .next()
        .unwrap()
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let values: Vec<f32> = bytes[start + header_len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(dims.len(), 2);
    assert_eq!(values.len(), dims[0] * dims[1]);
    ([dims[0], dims[1]], values)
}

#[test]
fn reads_a_vector_written_by_llama_cvector_generator() {
    let d = dir();
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("smollm2-mean.json")).unwrap()).unwrap();
    let ([rows, hidden], values) = read_npy_f32(&d.join("smollm2-mean.directions.npy"));
    let tensors = meta["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), rows);
    assert_eq!(
        meta["metadata"]["controlvector.layer_count"].as_u64(),
        Some(rows as u64)
    );

    let cv = ControlVector::read_gguf(&d.join("smollm2-mean.gguf")).unwrap();
    assert_eq!(cv.hidden(), hidden);
    assert_eq!(hidden, 576, "SmolLM2-135M's hidden size");
    // gguf-py's layer numbers, from the tensor names; SmolLM2 has 30
    // layers and llama.cpp steers all but layer 0.
    let want_layers: Vec<usize> = tensors
        .iter()
        .map(|t| t["layer"].as_u64().unwrap() as usize)
        .collect();
    assert_eq!(want_layers, (1..30).collect::<Vec<_>>());
    assert_eq!(cv.layers().collect::<Vec<_>>(), want_layers);
    for (t, want) in tensors.iter().zip(values.chunks_exact(hidden)) {
        let layer = t["layer"].as_u64().unwrap() as usize;
        assert_eq!(t["shape"], serde_json::json!([hidden]));
        let got = cv.get(layer).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(got), bits(want), "direction.{layer}");
        let norm = got
            .iter()
            .map(|&x| f64::from(x).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "direction.{layer}: |d| = {norm}");
    }
}
