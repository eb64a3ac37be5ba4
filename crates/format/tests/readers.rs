//! GGUF and safetensors readers against files written by hand (see
//! `support`) and, for GGUF, against a file written and described by gguf-py.

mod support;

use std::path::Path;
use support::{ggml, ty, GgufBuilder, StSpec, TempDir, TensorSpec, V};
use turbospark_core::QuantFormat;
use turbospark_format::gguf::{self, GgufArray, GgufError, GgufFile, GgufValue, GgufValueType};
use turbospark_format::safetensors::{
    self, SafetensorsCheckpoint, SafetensorsError, StDtype, StTensorInfo,
};

fn open_gguf_bytes(bytes: &[u8]) -> (TempDir, Result<GgufFile, GgufError>) {
    let dir = TempDir::new("gguf");
    let path = dir.write("model.gguf", bytes);
    let file = GgufFile::open(&path);
    (dir, file)
}

fn expect_gguf_err(bytes: &[u8]) -> GgufError {
    match gguf::parse_header(bytes) {
        Ok(h) => panic!("expected an error, parsed {} tensors", h.tensors().len()),
        Err(e) => e,
    }
}

#[test]
fn gguf_metadata_of_every_value_type_round_trips() {
    let bytes = GgufBuilder::default()
        .kv("u8", V::U8(250))
        .kv("i8", V::I8(-100))
        .kv("u16", V::U16(65000))
        .kv("i16", V::I16(-32000))
        .kv("u32", V::U32(4_000_000_000))
        .kv("i32", V::I32(-2_000_000_000))
        .kv("f32", V::F32(-0.375))
        .kv("bool", V::Bool(true))
        .kv("string", V::str("grüße ▁tokens"))
        .kv("u64", V::U64(u64::MAX - 1))
        .kv("i64", V::I64(i64::MIN + 1))
        .kv("f64", V::F64(1.0e300))
        .kv("arr.u8", V::Arr(ty::U8, vec![V::U8(1), V::U8(255)]))
        .kv("arr.i8", V::Arr(ty::I8, vec![V::I8(-1)]))
        .kv("arr.u16", V::Arr(ty::U16, vec![V::U16(7), V::U16(9)]))
        .kv("arr.i16", V::Arr(ty::I16, vec![V::I16(-7)]))
        .kv(
            "arr.u32",
            V::Arr(ty::U32, vec![V::U32(1), V::U32(2), V::U32(3)]),
        )
        .kv("arr.i32", V::Arr(ty::I32, vec![V::I32(-1), V::I32(5)]))
        .kv("arr.f32", V::Arr(ty::F32, vec![V::F32(0.5), V::F32(-2.0)]))
        .kv(
            "arr.bool",
            V::Arr(ty::BOOL, vec![V::Bool(false), V::Bool(true)]),
        )
        .kv(
            "arr.string",
            V::Arr(ty::STRING, vec![V::str("a"), V::str(""), V::str("ü")]),
        )
        .kv("arr.u64", V::Arr(ty::U64, vec![V::U64(u64::MAX)]))
        .kv("arr.i64", V::Arr(ty::I64, vec![V::I64(-3)]))
        .kv("arr.f64", V::Arr(ty::F64, vec![V::F64(2.5)]))
        .kv("arr.empty", V::Arr(ty::F32, vec![]))
        .kv(
            "arr.nested",
            V::Arr(
                ty::ARRAY,
                vec![
                    V::Arr(ty::I32, vec![V::I32(1), V::I32(2)]),
                    V::Arr(ty::STRING, vec![V::str("x")]),
                    V::Arr(ty::ARRAY, vec![V::Arr(ty::U8, vec![V::U8(3)])]),
                ],
            ),
        )
        .build();
    let (_dir, file) = open_gguf_bytes(&bytes);
    let file = file.expect("valid file");
    assert_eq!(file.version(), 3);
    assert_eq!(file.metadata().len(), 26);
    assert!(file.tensors().is_empty());

    let get = |k: &str| file.get(k).unwrap_or_else(|| panic!("key {k}"));
    assert_eq!(get("u8"), &GgufValue::U8(250));
    assert_eq!(get("i8"), &GgufValue::I8(-100));
    assert_eq!(get("u16"), &GgufValue::U16(65000));
    assert_eq!(get("i16"), &GgufValue::I16(-32000));
    assert_eq!(get("u32"), &GgufValue::U32(4_000_000_000));
    assert_eq!(get("i32"), &GgufValue::I32(-2_000_000_000));
    assert_eq!(get("f32"), &GgufValue::F32(-0.375));
    assert_eq!(get("bool"), &GgufValue::Bool(true));
    assert_eq!(get("string").as_str(), Some("grüße ▁tokens"));
    assert_eq!(get("u64"), &GgufValue::U64(u64::MAX - 1));
    assert_eq!(get("i64"), &GgufValue::I64(i64::MIN + 1));
    assert_eq!(get("f64"), &GgufValue::F64(1.0e300));

    let arr = |k: &str| {
        get(k)
            .as_array()
            .unwrap_or_else(|| panic!("{k} is an array"))
    };
    assert_eq!(arr("arr.u8"), &GgufArray::U8(vec![1, 255]));
    assert_eq!(arr("arr.i8"), &GgufArray::I8(vec![-1]));
    assert_eq!(arr("arr.u16"), &GgufArray::U16(vec![7, 9]));
    assert_eq!(arr("arr.i16"), &GgufArray::I16(vec![-7]));
    assert_eq!(arr("arr.u32").as_u32s(), Some(&[1, 2, 3][..]));
    assert_eq!(arr("arr.i32").as_i32s(), Some(&[-1, 5][..]));
    assert_eq!(arr("arr.f32").as_f32s(), Some(&[0.5, -2.0][..]));
    assert_eq!(arr("arr.bool"), &GgufArray::Bool(vec![false, true]));
    assert_eq!(arr("arr.string").as_strings().map(|s| s.len()), Some(3));
    assert_eq!(
        arr("arr.string").as_strings().map(|s| s[2].as_str()),
        Some("ü")
    );
    assert_eq!(arr("arr.u64"), &GgufArray::U64(vec![u64::MAX]));
    assert_eq!(arr("arr.i64"), &GgufArray::I64(vec![-3]));
    assert_eq!(arr("arr.f64"), &GgufArray::F64(vec![2.5]));
    assert_eq!(arr("arr.empty"), &GgufArray::F32(vec![]));
    assert_eq!(arr("arr.empty").elem_type(), GgufValueType::F32);
    assert_eq!(
        arr("arr.nested"),
        &GgufArray::Array(vec![
            GgufArray::I32(vec![1, 2]),
            GgufArray::String(vec!["x".to_string()]),
            GgufArray::Array(vec![GgufArray::U8(vec![3])]),
        ])
    );

    // Accessors widen across integer types and refuse what does not fit.
    assert_eq!(get("i8").as_u64(), None);
    assert_eq!(get("u16").as_u64(), Some(65000));
    assert_eq!(get("u64").as_i64(), None);
    assert_eq!(get("u32").as_u32(), Some(4_000_000_000));
    assert_eq!(get("f32").as_f64(), Some(-0.375));
    assert_eq!(get("i32").as_f64(), Some(-2.0e9));
    assert_eq!(arr("arr.i32").to_u64_vec(), None);
    assert_eq!(arr("arr.u16").to_u64_vec(), Some(vec![7, 9]));
    assert_eq!(arr("arr.f32").to_f64_vec(), Some(vec![0.5, -2.0]));
    assert_eq!(file.header().require_u64("u16").ok(), Some(65000));
    let err = file.header().require_u64("string").unwrap_err();
    assert!(
        matches!(&err, GgufError::WrongValueType { key, .. } if key == "string"),
        "{err}"
    );
    let err = file.header().require_str("nope").unwrap_err();
    assert_eq!(err.to_string(), "metadata key 'nope' is missing");
}

#[test]
fn gguf_tensors_report_reversed_dims_and_their_bytes() {
    let data: Vec<u8> = (0..96).collect();
    let bytes = GgufBuilder::default()
        .kv("general.architecture", V::str("llama"))
        .tensor(TensorSpec::new("a", ggml::F32, &[4, 3, 2], data.clone()))
        .tensor(TensorSpec::new("b", ggml::Q8_0, &[64, 1], vec![5; 68]))
        .tensor(TensorSpec::new("c", ggml::F16, &[], vec![9; 2]))
        .build();
    let (_dir, file) = open_gguf_bytes(&bytes);
    let file = file.expect("valid file");
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.data_offset() % 32, 0);

    let a = file.tensor("a").expect("tensor a");
    assert_eq!(a.dims, vec![4, 3, 2]);
    assert_eq!(a.shape(), vec![2, 3, 4]);
    assert_eq!(a.format(), Some(QuantFormat::F32));
    assert_eq!(a.byte_len, 96);
    assert_eq!(a.n_elements(), 24);
    assert_eq!(file.tensor_bytes(a), &data[..]);

    let b = file.tensor("b").expect("tensor b");
    assert_eq!(b.format(), Some(QuantFormat::Q8_0));
    assert_eq!(b.byte_len, 68);
    assert_eq!(b.offset, 96);
    assert_eq!(file.tensor_bytes(b), &[5; 68][..]);

    // Zero dimensions: a scalar of one element.
    let c = file.tensor("c").expect("tensor c");
    assert!(c.shape().is_empty());
    assert_eq!(file.tensor_bytes(c), &[9, 9]);

    let names: Vec<&str> = file.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"], "file order");
    assert!(file.tensor("missing").is_none());
}

#[test]
fn gguf_honours_custom_alignment() {
    let builder = GgufBuilder::default()
        .alignment(256)
        .tensor(TensorSpec::new("first", ggml::F32, &[3], vec![1; 12]))
        .tensor(TensorSpec::new("second", ggml::F32, &[5], vec![2; 20]));
    let bytes = builder.build();
    let h = gguf::parse_header(&bytes).expect("valid");
    assert_eq!(h.alignment(), 256);
    assert_eq!(h.data_offset(), 256, "header fits in one 256-byte unit");
    let second = h.tensor("second").expect("second");
    assert_eq!(second.offset, 256);
    assert_eq!(&bytes[512..532], &[2; 20][..]);

    // The same tensor at an offset aligned to 32 but not to 256.
    let mut misaligned = builder.clone();
    misaligned.tensors[1].offset_override = Some(32);
    let err = expect_gguf_err(&misaligned.build());
    assert!(
        matches!(&err, GgufError::MisalignedTensor { name, offset: 32, alignment: 256 } if name == "second"),
        "{err}"
    );

    let err = expect_gguf_err(
        &GgufBuilder::default()
            .kv("general.alignment", V::U32(48))
            .build(),
    );
    assert!(
        matches!(err, GgufError::BadAlignment { value: 48 }),
        "{err}"
    );
    let err = expect_gguf_err(
        &GgufBuilder::default()
            .kv("general.alignment", V::str("64"))
            .build(),
    );
    assert!(
        matches!(&err, GgufError::WrongValueType { key, .. } if key == "general.alignment"),
        "{err}"
    );
}

#[test]
fn gguf_truncated_at_every_byte_is_an_error() {
    let bytes = support::sample_gguf();
    assert!(gguf::parse_header(&bytes).is_ok());
    for cut in 0..bytes.len() {
        let result = gguf::parse_header(&bytes[..cut]);
        assert!(result.is_err(), "cut at {cut} of {} parsed", bytes.len());
    }
    let err = expect_gguf_err(&bytes[..30]);
    assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
}

#[test]
fn gguf_tensor_past_the_end_is_named() {
    let mut bytes = support::sample_gguf();
    let full_len = bytes.len() as u64;
    bytes.truncate(bytes.len() - 1);
    let err = expect_gguf_err(&bytes);
    match &err {
        GgufError::TensorOutOfBounds {
            name,
            end,
            file_len,
        } => {
            assert_eq!(name, "output_norm.weight");
            assert_eq!(*end, full_len);
            assert_eq!(*file_len, full_len - 1);
        }
        other => panic!("expected TensorOutOfBounds, got {other}"),
    }
    assert!(err.to_string().contains("output_norm.weight"), "{err}");

    // An offset far past the end, and one that overflows.
    for offset in [1 << 20, u64::MAX - 31] {
        let b = GgufBuilder {
            tensors: vec![TensorSpec {
                offset_override: Some(offset),
                ..TensorSpec::new("w", ggml::F32, &[8], vec![0; 32])
            }],
            ..GgufBuilder::default()
        };
        let err = expect_gguf_err(&b.build());
        assert!(
            matches!(&err, GgufError::TensorOutOfBounds { name, .. } if name == "w"),
            "{err}"
        );
    }
}

#[test]
fn gguf_rejects_bad_magic_old_versions_and_big_endian() {
    let mut bytes = support::sample_gguf();
    bytes[..4].copy_from_slice(b"GGML");
    let err = expect_gguf_err(&bytes);
    assert!(
        matches!(err, GgufError::BadMagic { found } if &found == b"GGML"),
        "{err}"
    );
    assert!(err.to_string().contains("\"GGML\""), "{err}");

    let v1 = GgufBuilder {
        version: 1,
        ..GgufBuilder::default()
    };
    let err = expect_gguf_err(&v1.build());
    assert!(matches!(err, GgufError::UnsupportedVersion(1)), "{err}");
    assert_eq!(
        err.to_string(),
        "GGUF version 1 is not supported (expected 2 or 3)"
    );

    let v2 = GgufBuilder {
        version: 2,
        ..GgufBuilder::default()
    };
    assert_eq!(
        gguf::parse_header(&v2.build()).map(|h| h.version()).ok(),
        Some(2)
    );

    let mut big = GgufBuilder::default().build();
    big[4..8].copy_from_slice(&3u32.to_be_bytes());
    let err = expect_gguf_err(&big);
    assert!(matches!(err, GgufError::BigEndian { version: 3 }), "{err}");
}

#[test]
fn gguf_rejects_malformed_tables() {
    let dup = GgufBuilder::default()
        .tensor(TensorSpec::new("w", ggml::F32, &[1], vec![0; 4]))
        .tensor(TensorSpec::new("w", ggml::F32, &[1], vec![0; 4]))
        .build();
    assert!(matches!(expect_gguf_err(&dup), GgufError::DuplicateTensor { name } if name == "w"));

    let dup_key = GgufBuilder::default()
        .kv("k", V::U8(1))
        .kv("k", V::U8(2))
        .build();
    assert!(matches!(expect_gguf_err(&dup_key), GgufError::DuplicateKey { key } if key == "k"));

    let five_dims = GgufBuilder::default()
        .tensor(TensorSpec::new(
            "w",
            ggml::F32,
            &[1, 1, 1, 1, 1],
            vec![0; 4],
        ))
        .build();
    let err = expect_gguf_err(&five_dims);
    assert!(
        matches!(&err, GgufError::TooManyDims { name, n_dims: 5, max: 4 } if name == "w"),
        "{err}"
    );

    let overflow = GgufBuilder::default()
        .tensor(TensorSpec::new("w", ggml::F32, &[1 << 32, 1 << 32], vec![]))
        .build();
    let err = expect_gguf_err(&overflow);
    assert!(
        matches!(&err, GgufError::SizeOverflow { name, .. } if name == "w"),
        "{err}"
    );

    let partial = GgufBuilder::default()
        .tensor(TensorSpec::new("q", ggml::Q8_0, &[33], vec![0; 68]))
        .build();
    let err = expect_gguf_err(&partial);
    assert!(
        matches!(&err, GgufError::PartialBlock { name, row_len: 33, block_elems: 32, .. } if name == "q"),
        "{err}"
    );

    let unknown = GgufBuilder::default()
        .tensor(TensorSpec::new("old", 4, &[32], vec![0; 32]))
        .build();
    let err = expect_gguf_err(&unknown);
    assert!(
        matches!(&err, GgufError::UnknownGgmlType { name, ggml_type: 4, .. } if name == "old"),
        "{err}"
    );
    assert!(err.to_string().contains("q4_2"), "{err}");

    let bad_type = GgufBuilder::default()
        .kv("k", V::Raw(13, vec![0; 8]))
        .build();
    let err = expect_gguf_err(&bad_type);
    assert!(
        matches!(&err, GgufError::UnknownValueType { key, type_id: 13 } if key == "k"),
        "{err}"
    );

    let bad_bool = GgufBuilder::default()
        .kv("b", V::Raw(ty::BOOL, vec![2]))
        .build();
    assert!(matches!(
        expect_gguf_err(&bad_bool),
        GgufError::InvalidBool { byte: 2, .. }
    ));

    let bad_utf8 = GgufBuilder::default()
        .kv(
            "s",
            V::Raw(
                ty::STRING,
                [&2u64.to_le_bytes()[..], &[0xff, 0xfe]].concat(),
            ),
        )
        .build();
    let err = expect_gguf_err(&bad_utf8);
    assert!(
        matches!(&err, GgufError::InvalidUtf8 { what, .. } if what.contains("'s'")),
        "{err}"
    );

    // Arrays of arrays nested past the limit.
    let mut deep = V::Arr(ty::U8, vec![]);
    for _ in 0..gguf::MAX_ARRAY_NESTING {
        deep = V::Arr(ty::ARRAY, vec![deep]);
    }
    let err = expect_gguf_err(&GgufBuilder::default().kv("deep", deep).build());
    assert!(
        matches!(&err, GgufError::ArrayTooDeep { key, .. } if key == "deep"),
        "{err}"
    );
}

#[test]
fn gguf_huge_counts_fail_without_allocating() {
    // Tensor count and metadata count of 2^64 - 1 in a 24-byte file.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(u64::MAX.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    let err = expect_gguf_err(&bytes);
    assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        expect_gguf_err(&bytes),
        GgufError::Truncated { .. }
    ));

    // An array claiming 2^62 strings, and a string claiming 2^63 bytes.
    let arr = GgufBuilder::default()
        .kv(
            "a",
            V::Raw(
                ty::ARRAY,
                [
                    ty::STRING.to_le_bytes().to_vec(),
                    (1u64 << 62).to_le_bytes().to_vec(),
                ]
                .concat(),
            ),
        )
        .build();
    assert!(matches!(expect_gguf_err(&arr), GgufError::Truncated { .. }));
    let s = GgufBuilder::default()
        .kv("s", V::Raw(ty::STRING, (1u64 << 63).to_le_bytes().to_vec()))
        .build();
    let err = expect_gguf_err(&s);
    assert!(
        matches!(&err, GgufError::Truncated { what, .. } if what.contains("'s'")),
        "{err}"
    );
}

#[test]
fn gguf_unsupported_types_are_listed_and_sized() {
    let bytes = GgufBuilder::default()
        .tensor(TensorSpec::new("k", ggml::Q2_K, &[512, 3], vec![4; 6 * 84]))
        .build();
    let h = gguf::parse_header(&bytes).expect("valid");
    let t = h.tensor("k").expect("k");
    assert_eq!(t.format(), None);
    assert_eq!(t.type_name(), "q2_k");
    assert_eq!(t.byte_len, 6 * 84);
}

#[test]
fn gguf_large_vocabulary_parses() {
    let tokens: Vec<V> = (0..150_000).map(|i| V::Str(format!("tok{i}"))).collect();
    let scores: Vec<V> = (0..150_000).map(|i| V::F32(i as f32)).collect();
    let bytes = GgufBuilder::default()
        .kv("tokenizer.ggml.tokens", V::Arr(ty::STRING, tokens))
        .kv("tokenizer.ggml.scores", V::Arr(ty::F32, scores))
        .build();
    let h = gguf::parse_header(&bytes).expect("valid");
    let tokens = h.require_array("tokenizer.ggml.tokens").expect("tokens");
    assert_eq!(tokens.len(), 150_000);
    assert_eq!(
        tokens.as_strings().map(|t| t[149_999].as_str()),
        Some("tok149999")
    );
    let scores = h.require_array("tokenizer.ggml.scores").expect("scores");
    assert_eq!(scores.as_f32s().map(|s| s[7]), Some(7.0));
}

#[test]
fn gguf_open_errors_name_the_file() {
    let dir = TempDir::new("gguf-open");
    let path = dir.write("bad.gguf", b"PK\x03\x04 this is a zip");
    let err = GgufFile::open(&path).unwrap_err();
    assert!(matches!(err.root(), GgufError::BadMagic { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("bad.gguf") && msg.contains("not a GGUF file"),
        "{msg}"
    );

    let empty = dir.write("empty.gguf", b"");
    let err = GgufFile::open(&empty).unwrap_err();
    assert!(matches!(err.root(), GgufError::Truncated { .. }), "{err}");

    let missing = dir.path().join("missing.gguf");
    let err = GgufFile::open(&missing).unwrap_err();
    assert!(matches!(&err, GgufError::Io { .. }), "{err}");
    assert!(err.to_string().contains("missing.gguf"), "{err}");
}

/// The file and description written by `scripts/make_reader_fixtures.py`
/// with gguf-py's writer and reader.
#[test]
fn gguf_matches_gguf_py_fixture() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let file = GgufFile::open(&dir.join("gguf_writer_tiny.gguf")).expect("fixture opens");
    let text = std::fs::read_to_string(dir.join("gguf_writer_tiny.json")).expect("description");
    let desc: serde_json::Value = serde_json::from_str(&text).expect("json");

    assert_eq!(Some(file.alignment()), desc["alignment"].as_u64());
    assert_eq!(Some(file.data_offset()), desc["data_offset"].as_u64());
    assert_eq!(Some(file.file_len()), desc["file_len"].as_u64());

    let meta = desc["metadata"].as_object().expect("metadata");
    assert_eq!(file.metadata().len(), meta.len());
    for (key, want) in meta {
        let got = file.get(key).unwrap_or_else(|| panic!("key {key}"));
        let types: Vec<u64> = want["types"]
            .as_array()
            .expect("types")
            .iter()
            .filter_map(|t| t.as_u64())
            .collect();
        assert_eq!(u64::from(got.value_type().id()), types[0], "{key}");
        if let Some(a) = got.as_array() {
            assert_eq!(u64::from(a.elem_type().id()), types[1], "{key}");
        }
        assert_eq!(to_json(got), want["value"], "{key}");
    }

    let tensors = desc["tensors"].as_array().expect("tensors");
    assert_eq!(file.tensors().len(), tensors.len());
    for (got, want) in file.tensors().iter().zip(tensors) {
        assert_eq!(Some(got.name.as_str()), want["name"].as_str());
        assert_eq!(
            Some(u64::from(got.ggml_type)),
            want["ggml_type"].as_u64(),
            "{}",
            got.name
        );
        let dims: Vec<u64> = want["dims"]
            .as_array()
            .expect("dims")
            .iter()
            .filter_map(|d| d.as_u64())
            .collect();
        assert_eq!(got.dims, dims, "{}", got.name);
        assert_eq!(
            Some(got.n_elements()),
            want["n_elements"].as_u64(),
            "{}",
            got.name
        );
        assert_eq!(Some(got.byte_len), want["n_bytes"].as_u64(), "{}", got.name);
        assert_eq!(
            Some(file.data_offset() + got.offset),
            want["abs_offset"].as_u64(),
            "{}",
            got.name
        );
        assert_eq!(
            Some(hex(file.tensor_bytes(got)).as_str()),
            want["data_hex"].as_str(),
            "{}",
            got.name
        );
    }
    let down = file.tensor("blk.0.ffn_down.weight").expect("q8_0 tensor");
    assert_eq!(down.format(), Some(QuantFormat::Q8_0));
    assert_eq!(down.shape(), vec![2, 32]);
    assert_eq!(
        file.tensor("blk.0.ffn_up.weight").and_then(|t| t.format()),
        None,
        "q2_k is listed, unsupported"
    );
}

fn to_json(v: &GgufValue) -> serde_json::Value {
    use serde_json::Value;
    match v {
        GgufValue::String(s) => Value::from(s.as_str()),
        GgufValue::Bool(b) => Value::from(*b),
        GgufValue::F32(x) => Value::from(f64::from(*x)),
        GgufValue::F64(x) => Value::from(*x),
        GgufValue::U64(x) => Value::from(*x),
        GgufValue::Array(a) => array_to_json(a),
        other => Value::from(other.as_i64().expect("integer")),
    }
}

fn array_to_json(a: &GgufArray) -> serde_json::Value {
    use serde_json::Value;
    match a {
        GgufArray::String(v) => v.iter().map(|s| Value::from(s.as_str())).collect(),
        GgufArray::Bool(v) => v.iter().map(|&b| Value::from(b)).collect(),
        GgufArray::Array(v) => v.iter().map(array_to_json).collect(),
        other => match other.to_u64_vec() {
            Some(v) => v.into_iter().map(Value::from).collect(),
            None => other
                .to_f64_vec()
                .expect("numeric")
                .into_iter()
                .map(|x| {
                    if x.fract() == 0.0
                        && matches!(
                            other,
                            GgufArray::I8(_)
                                | GgufArray::I16(_)
                                | GgufArray::I32(_)
                                | GgufArray::I64(_)
                        )
                    {
                        Value::from(x as i64)
                    } else {
                        Value::from(x)
                    }
                })
                .collect(),
        },
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------- safetensors

fn expect_st_err(bytes: &[u8]) -> SafetensorsError {
    match safetensors::parse_header(bytes) {
        Ok(h) => panic!("expected an error, parsed {} tensors", h.tensors.len()),
        Err(e) => e,
    }
}

#[test]
fn safetensors_single_file_lists_sorted_tensors_with_absolute_ranges() {
    let bytes = support::sample_safetensors();
    let dir = TempDir::new("st-single");
    let path = dir.write("model.safetensors", &bytes);
    let ckpt = SafetensorsCheckpoint::open_dir(dir.path()).expect("opens");
    let names: Vec<&str> = ckpt.tensors().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["blocks", "model.embed_tokens.weight", "model.norm.weight"]
    );
    assert_eq!(ckpt.shard_count(), 1);
    assert_eq!(ckpt.shard_path(0), Some(path.as_path()));
    assert_eq!(
        ckpt.shard_metadata(0)
            .and_then(|m| m.get("format"))
            .map(String::as_str),
        Some("pt")
    );

    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let embed = ckpt.tensor("model.embed_tokens.weight").expect("embed");
    assert_eq!(
        embed,
        &StTensorInfo {
            name: "model.embed_tokens.weight".to_string(),
            dtype: StDtype::Bf16,
            shape: vec![3, 2],
            shard: 0,
            range: 8 + header_len..8 + header_len + 12,
        }
    );
    assert_eq!(ckpt.tensor_bytes(embed), &[7; 12]);
    let norm = ckpt.tensor("model.norm.weight").expect("norm");
    assert_eq!(ckpt.tensor_bytes(norm), &[8; 8]);
    assert_eq!(norm.dtype.quant_format(), Some(QuantFormat::F32));
    let blocks = ckpt.tensor("blocks").expect("blocks");
    assert_eq!(ckpt.tensor_bytes(blocks), &[9; 6]);
    assert!(blocks.dtype.is_supported());
    assert!(!StDtype::F8E4M3.is_supported());
}

#[test]
fn safetensors_header_larger_than_file_names_both_numbers() {
    let mut bytes = 1000u64.to_le_bytes().to_vec();
    bytes.extend(b"{}");
    let err = expect_st_err(&bytes);
    assert!(matches!(
        err,
        SafetensorsError::HeaderTooLarge {
            header_len: 1000,
            file_len: 10
        }
    ));
    assert_eq!(
        err.to_string(),
        "header length 1000 larger than file (10 bytes)"
    );

    let dir = TempDir::new("st-large");
    let path = dir.write("x.safetensors", &bytes);
    let err = SafetensorsCheckpoint::open_file(&path).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("x.safetensors") && msg.contains("1000") && msg.contains("10 bytes"),
        "{msg}"
    );

    assert!(matches!(
        expect_st_err(b"\x01\x00"),
        SafetensorsError::TooShort { file_len: 2 }
    ));
    let huge = [u64::MAX.to_le_bytes().to_vec(), b"{}".to_vec()].concat();
    assert!(matches!(
        expect_st_err(&huge),
        SafetensorsError::HeaderTooLarge { .. }
    ));
}

#[test]
fn safetensors_validates_entries() {
    let entry = |json: &str, data: &[u8]| support::raw_safetensors(json.as_bytes(), data);

    let err = expect_st_err(&entry(
        r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
        &[0; 8],
    ));
    assert!(
        matches!(&err, SafetensorsError::SizeMismatch { name, expected: 8, actual: 4, .. } if name == "w"),
        "{err}"
    );
    let err = expect_st_err(&entry(
        r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
        &[0; 7],
    ));
    assert!(
        matches!(&err, SafetensorsError::TensorOutOfBounds { name, end: 8, data_len: 7 } if name == "w"),
        "{err}"
    );
    let err = expect_st_err(&entry(
        r#"{"w":{"dtype":"F32","shape":[],"data_offsets":[4,0]}}"#,
        &[0; 8],
    ));
    assert!(
        matches!(
            err,
            SafetensorsError::OffsetsReversed {
                begin: 4,
                end: 0,
                ..
            }
        ),
        "{err}"
    );
    let err = expect_st_err(&entry(
        r#"{"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,1]}}"#,
        &[0; 1],
    ));
    assert!(
        matches!(&err, SafetensorsError::UnknownDtype { dtype, .. } if dtype == "Q4"),
        "{err}"
    );
    let err = expect_st_err(&entry(
        r#"{"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#,
        &[0; 2],
    ));
    assert!(
        matches!(err, SafetensorsError::PartialByte { elements: 3, .. }),
        "{err}"
    );
    let err = expect_st_err(&entry(
        r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}"#,
        &[],
    ));
    assert!(
        matches!(err, SafetensorsError::SizeOverflow { .. }),
        "{err}"
    );
    let err = expect_st_err(&entry(
        r#"{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}"#,
        &[],
    ));
    assert!(
        matches!(&err, SafetensorsError::BadTensorEntry { name, .. } if name == "w"),
        "{err}"
    );
    let err = expect_st_err(&entry(
        r#"{"w":{"dtype":"U8","shape":[],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[],"data_offsets":[0,1]}}"#,
        &[0],
    ));
    assert!(
        matches!(&err, SafetensorsError::DuplicateName { name } if name == "w"),
        "{err}"
    );
    let err = expect_st_err(&entry(r#"{"__metadata__":{"a":1}}"#, &[]));
    assert!(matches!(err, SafetensorsError::BadMetadata { .. }), "{err}");
    let err = expect_st_err(&entry(r#"{"w":"#, &[]));
    assert!(matches!(err, SafetensorsError::InvalidJson { .. }), "{err}");
    let err = expect_st_err(&entry(r#"[1,2]"#, &[]));
    assert!(matches!(err, SafetensorsError::InvalidJson { .. }), "{err}");

    // Sub-byte dtypes that fill whole bytes are fine, as are empty tensors.
    let ok = safetensors::parse_header(&entry(
        r#"{"f4":{"dtype":"F4","shape":[2,2],"data_offsets":[0,2]},"e":{"dtype":"BF16","shape":[0,5],"data_offsets":[2,2]}}"#,
        &[0; 2],
    ))
    .expect("valid");
    assert_eq!(ok.tensors.len(), 2);
    assert_eq!(ok.tensors[1].range.end - ok.tensors[1].range.start, 2);
}

#[test]
fn safetensors_truncated_at_every_byte_is_an_error() {
    let bytes = support::sample_safetensors();
    assert!(safetensors::parse_header(&bytes).is_ok());
    for cut in 0..bytes.len() {
        assert!(
            safetensors::parse_header(&bytes[..cut]).is_err(),
            "cut at {cut} parsed"
        );
    }
}

/// A shard of one-dimensional U8 tensors.
fn shard(tensors: &[(&str, &[u8])]) -> Vec<u8> {
    let shapes: Vec<[u64; 1]> = tensors.iter().map(|(_, d)| [d.len() as u64]).collect();
    let specs: Vec<StSpec<'_>> = tensors
        .iter()
        .zip(&shapes)
        .map(|((name, data), shape)| StSpec {
            name,
            dtype: "U8",
            shape,
            data,
        })
        .collect();
    support::safetensors_bytes(&specs, &[])
}

const INDEX: &str = r#"{
  "metadata": {"total_size": 10},
  "weight_map": {
    "a": "model-00001-of-00002.safetensors",
    "b": "model-00001-of-00002.safetensors",
    "c": "model-00002-of-00002.safetensors"
  }
}"#;

#[test]
fn safetensors_sharded_index_opens_each_shard_once() {
    let dir = TempDir::new("st-sharded");
    dir.write(
        "model-00001-of-00002.safetensors",
        &shard(&[("a", &[1, 1]), ("b", &[2, 2, 2])]),
    );
    dir.write(
        "model-00002-of-00002.safetensors",
        &shard(&[("c", &[3; 5]), ("unlisted", &[4])]),
    );
    dir.write("model.safetensors.index.json", INDEX.as_bytes());
    let ckpt = SafetensorsCheckpoint::open_dir(dir.path()).expect("opens");
    assert_eq!(ckpt.shard_count(), 2);
    let summary: Vec<(&str, usize, &[u8])> = ckpt
        .tensors()
        .map(|t| (t.name.as_str(), t.shard, ckpt.tensor_bytes(t)))
        .collect();
    assert_eq!(
        summary,
        [
            ("a", 0, &[1, 1][..]),
            ("b", 0, &[2, 2, 2][..]),
            ("c", 1, &[3; 5][..])
        ],
        "tensors the index does not name are left out"
    );
    assert!(ckpt
        .shard_path(1)
        .is_some_and(|p| p.ends_with("model-00002-of-00002.safetensors")));
}

#[test]
fn safetensors_index_errors_name_the_shard() {
    let dir = TempDir::new("st-missing");
    dir.write(
        "model-00001-of-00002.safetensors",
        &shard(&[("a", &[1]), ("b", &[2])]),
    );
    let index = dir.write("model.safetensors.index.json", INDEX.as_bytes());
    let err = SafetensorsCheckpoint::open_dir(dir.path()).unwrap_err();
    match &err {
        SafetensorsError::MissingShard { index: i, shard } => {
            assert_eq!(i, &index);
            assert!(shard.ends_with("model-00002-of-00002.safetensors"));
        }
        other => panic!("expected MissingShard, got {other}"),
    }
    assert!(
        err.to_string()
            .contains("model-00002-of-00002.safetensors does not exist"),
        "{err}"
    );

    // The shard exists but lacks a tensor the index maps to it.
    dir.write("model-00002-of-00002.safetensors", &shard(&[("d", &[1])]));
    let err = SafetensorsCheckpoint::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(&err, SafetensorsError::TensorMissingFromShard { name, shard } if name == "c" && shard.ends_with("model-00002-of-00002.safetensors")),
        "{err}"
    );

    // A corrupt shard is reported with its path.
    dir.write(
        "model-00002-of-00002.safetensors",
        b"\xff\xff\xff\xff\xff\xff\xff\xff",
    );
    let err = SafetensorsCheckpoint::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(err.root(), SafetensorsError::HeaderTooLarge { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("model-00002-of-00002.safetensors"),
        "{err}"
    );

    dir.write(
        "model.safetensors.index.json",
        br#"{"weight_map":{"a":"../outside.safetensors"}}"#,
    );
    let err = SafetensorsCheckpoint::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(&err, SafetensorsError::BadShardPath { shard, .. } if shard == "../outside.safetensors"),
        "{err}"
    );

    dir.write("model.safetensors.index.json", br#"{"metadata":{}}"#);
    let err = SafetensorsCheckpoint::open_dir(dir.path()).unwrap_err();
    assert!(matches!(err, SafetensorsError::BadIndex { .. }), "{err}");
    assert!(err.to_string().contains("weight_map"), "{err}");
}

#[test]
fn safetensors_directory_without_index_opens_all_shards_in_name_order() {
    let dir = TempDir::new("st-dir");
    let err = SafetensorsCheckpoint::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(err, SafetensorsError::NoSafetensors { .. }),
        "{err}"
    );

    dir.write("b.safetensors", &shard(&[("y", &[2])]));
    dir.write("a.safetensors", &shard(&[("x", &[1])]));
    dir.write("notes.txt", b"not a shard");
    let ckpt = SafetensorsCheckpoint::open_dir(dir.path()).expect("opens");
    assert!(ckpt
        .shard_path(0)
        .is_some_and(|p| p.ends_with("a.safetensors")));
    assert_eq!(ckpt.tensor("y").map(|t| t.shard), Some(1));

    dir.write("c.safetensors", &shard(&[("x", &[3])]));
    let err = SafetensorsCheckpoint::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(&err, SafetensorsError::DuplicateAcrossShards { name, first, second } if name == "x" && first.ends_with("a.safetensors") && second.ends_with("c.safetensors")),
        "{err}"
    );
}

/// The file written by the reference `safetensors` package and described with
/// its `safe_open` by `scripts/make_reader_fixtures.py`.
#[test]
fn safetensors_matches_reference_fixture() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let path = dir.join("safetensors_writer_tiny.safetensors");
    let ckpt = SafetensorsCheckpoint::open_file(&path).expect("fixture opens");
    let text =
        std::fs::read_to_string(dir.join("safetensors_writer_tiny.json")).expect("description");
    let desc: serde_json::Value = serde_json::from_str(&text).expect("json");

    let metadata = ckpt.shard_metadata(0).expect("one shard");
    let want_meta = desc["metadata"].as_object().expect("metadata");
    assert_eq!(metadata.len(), want_meta.len());
    for (k, v) in want_meta {
        assert_eq!(metadata.get(k).map(String::as_str), v.as_str(), "{k}");
    }

    let tensors = desc["tensors"].as_array().expect("tensors");
    assert_eq!(ckpt.len(), tensors.len());
    for (got, want) in ckpt.tensors().zip(tensors) {
        assert_eq!(Some(got.name.as_str()), want["name"].as_str());
        assert_eq!(
            Some(got.dtype.name()),
            want["dtype"].as_str(),
            "{}",
            got.name
        );
        let shape: Vec<u64> = want["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .filter_map(|d| d.as_u64())
            .collect();
        assert_eq!(got.shape, shape, "{}", got.name);
        assert_eq!(
            Some(hex(ckpt.tensor_bytes(got)).as_str()),
            want["data_hex"].as_str(),
            "{}",
            got.name
        );
        assert!(got.range.end <= desc["file_len"].as_u64().expect("file_len"));
    }
}
