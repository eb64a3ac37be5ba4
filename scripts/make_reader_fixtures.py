"""Cross-check fixtures for turbospark's GGUF and safetensors readers.

Writes a tiny GGUF with gguf-py's GGUFWriter (the writer behind llama.cpp's
converters) and describes it with gguf-py's own GGUFReader; writes a tiny
safetensors file with the reference `safetensors` package and describes it
with its `safe_open`. The Rust readers are thereby compared against
independent implementations, not against themselves.

    python3 -m venv /tmp/rvenv && /tmp/rvenv/bin/pip install gguf numpy safetensors
    /tmp/rvenv/bin/python scripts/make_reader_fixtures.py

Outputs crates/format/tests/data/{gguf,safetensors}_writer_tiny.* ; the tests
`gguf_matches_gguf_py_fixture` and `safetensors_matches_reference_fixture`
in crates/format/tests/readers.rs read them.
"""

import json
from pathlib import Path

import gguf
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

OUT = Path(__file__).resolve().parent.parent / "crates" / "format" / "tests" / "data"
GGUF_PATH = OUT / "gguf_writer_tiny.gguf"
JSON_PATH = OUT / "gguf_writer_tiny.json"
ST_PATH = OUT / "safetensors_writer_tiny.safetensors"
ST_JSON_PATH = OUT / "safetensors_writer_tiny.json"


def write() -> None:
    w = gguf.GGUFWriter(str(GGUF_PATH), arch="llama")
    w.add_custom_alignment(64)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -5)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4_000_000_000)
    w.add_int32("test.i32", -2_000_000_000)
    w.add_float32("test.f32", 0.15625)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo wörld")
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", -1.0e-300)
    w.add_array("test.arr_str", ["<s>", "▁a", "", "ü"])
    w.add_array("test.arr_f32", [0.5, -1.25, 3.0])
    w.add_array("test.arr_i32", [1, -2, 3])
    w.add_array("test.arr_bool", [True, False])

    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(5).astype(np.float16))
    # Quantized tensors are handed over as raw bytes: rows x bytes-per-row.
    q8 = rng.integers(0, 256, size=(2, 34), dtype=np.uint8)
    w.add_tensor("blk.0.ffn_down.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    q2k = rng.integers(0, 256, size=(1, 84), dtype=np.uint8)
    w.add_tensor("blk.0.ffn_up.weight", q2k, raw_dtype=gguf.GGMLQuantizationType.Q2_K)
    w.add_tensor("scalarish", np.array([7.0], dtype=np.float32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def describe() -> dict:
    r = gguf.GGUFReader(str(GGUF_PATH))
    metadata = {}
    for name, field in r.fields.items():
        if name.startswith("GGUF."):
            continue  # the reader's view of the fixed header fields
        value = field.contents()
        metadata[name] = {"types": [int(t) for t in field.types], "value": value}
    tensors = []
    for t in r.tensors:
        data = np.asarray(t.data).tobytes()
        tensors.append(
            {
                "name": t.name,
                "ggml_type": int(t.tensor_type),
                "dims": [int(d) for d in t.field.parts[3]],  # ne as stored
                "n_elements": int(t.n_elements),
                "n_bytes": int(t.n_bytes),
                "abs_offset": int(t.data_offset),
                "data_hex": data.hex(),
            }
        )
    return {
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "file_len": GGUF_PATH.stat().st_size,
        "metadata": metadata,
        "tensors": tensors,
    }


def write_safetensors() -> None:
    rng = np.random.default_rng(1)
    tensors = {
        "model.layers.0.mlp.experts.gate_up_proj_blocks": rng.integers(0, 256, (2, 3, 4), dtype=np.uint8),
        "model.norm.weight": rng.standard_normal(3).astype(np.float32),
        "model.embed_tokens.weight": rng.standard_normal((4, 2)).astype(np.float16),
        "position_ids": np.arange(5, dtype=np.int64),
        "mask": np.array([True, False, True]),
        "scalar": np.array(2.5, dtype=np.float64),
        "empty": np.zeros((0, 3), dtype=np.int32),
    }
    save_file(tensors, str(ST_PATH), metadata={"format": "np", "note": "turbospark fixture"})


def describe_safetensors() -> dict:
    tensors = []
    with safe_open(str(ST_PATH), framework="np") as f:
        metadata = dict(sorted((f.metadata() or {}).items()))
        for name in sorted(f.keys()):
            t = f.get_tensor(name)
            tensors.append(
                {
                    "name": name,
                    "dtype": f.get_slice(name).get_dtype(),
                    "shape": list(t.shape),
                    "data_hex": np.ascontiguousarray(t).tobytes().hex(),
                }
            )
    return {"file_len": ST_PATH.stat().st_size, "metadata": metadata, "tensors": tensors}


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    write()
    JSON_PATH.write_text(json.dumps(describe(), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {GGUF_PATH} ({GGUF_PATH.stat().st_size} bytes) and {JSON_PATH}")
    write_safetensors()
    ST_JSON_PATH.write_text(json.dumps(describe_safetensors(), indent=1) + "\n")
    print(f"wrote {ST_PATH} ({ST_PATH.stat().st_size} bytes) and {ST_JSON_PATH}")
