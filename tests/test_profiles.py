"""Model and hardware profiles: bundled files load, match their architectures, and
malformed files fail with the file and field named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from longroute.estimators.profiles import (
    ModelProfile,
    ProfileError,
    hardware_profile_names,
    load_hardware_profile,
    load_hardware_profile_file,
    load_model_profile,
    load_model_profile_file,
    model_profile_names,
)

REQUIRED_MODELS = {
    "llama-3-8b",
    "llama-3-70b",
    "llama-3-8b-1m",
    "llama-3-70b-1m",
    "qwen3-32b",
    "qwen3.5-35b-a3b",
    "granite-3.1-2b",
    "granite-3.1-8b",
    "phi-3-mini",
    "phi-3-medium",
}
REQUIRED_HARDWARE = {"a100-80g", "h100", "h200", "l40s"}


def test_required_profiles_are_bundled() -> None:
    assert set(model_profile_names()) >= REQUIRED_MODELS
    assert set(hardware_profile_names()) >= REQUIRED_HARDWARE


@pytest.mark.parametrize("name", model_profile_names())
def test_every_model_profile_loads(name: str) -> None:
    profile = load_model_profile(name)
    assert profile.name == name
    assert profile.source.strip()
    assert profile.num_active_params <= profile.num_params


@pytest.mark.parametrize("name", hardware_profile_names())
def test_every_hardware_profile_loads(name: str) -> None:
    profile = load_hardware_profile(name)
    assert profile.name == name
    assert 0 < profile.linear_mfu <= 1 and 0 < profile.attention_mfu <= 1


def dense_param_count(m: ModelProfile) -> int:
    """Parameters of a Llama-style decoder: GQA attention, SwiGLU MLP, RMSNorms."""
    attention = m.hidden_size * m.head_dim * (2 * m.num_attention_heads + 2 * m.num_kv_heads)
    mlp = 3 * m.hidden_size * m.intermediate_size
    return m.num_layers * (attention + mlp + 2 * m.hidden_size) + m.num_embedding_params


@pytest.mark.parametrize("name", [n for n in sorted(REQUIRED_MODELS) if "a3b" not in n])
def test_dense_param_counts_agree_with_their_shapes(name: str) -> None:
    profile = load_model_profile(name)
    assert profile.num_experts == 0
    assert dense_param_count(profile) == pytest.approx(profile.num_params, rel=0.01)


def test_moe_profile_shape() -> None:
    moe = load_model_profile("qwen3.5-35b-a3b")
    assert moe.is_moe
    assert 33e9 < moe.num_params < 37e9
    assert 2.5e9 < moe.num_active_params < 4e9
    assert moe.num_kv_layers == 10 < moe.num_layers


def test_datasheet_numbers_of_the_brief() -> None:
    h100, h200, l40s = (load_hardware_profile(n) for n in ("h100", "h200", "l40s"))
    assert h100.peak_flops_per_s == h200.peak_flops_per_s == 989e12
    assert h100.memory_bandwidth_bytes_per_s == 3.35e12
    assert h200.memory_bandwidth_bytes_per_s == 4.8e12
    assert l40s.peak_flops_per_s == 362e12 and l40s.memory_bandwidth_bytes_per_s == 864e9
    assert 80e9 <= h100.memory_bytes < 86e9 and 141e9 <= h200.memory_bytes < 152e9


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(ProfileError, match=r"'llama-4'.*valid: .*llama-3-8b"):
        load_model_profile("llama-4")
    with pytest.raises(
        ProfileError, match=r"'b200'.*valid: a100-80g, a40, a6000, h100, h200, l40s"
    ):
        load_hardware_profile("b200")
    with pytest.raises(ValueError):  # ProfileError is a ValueError
        load_model_profile("")


def write_variant(tmp_path: Path, bundled: str, /, **changes: object) -> Path:
    data = yaml.safe_load(
        (Path(__file__).parents[1] / "src/longroute/data/profiles" / bundled).read_text()
    )
    for key, value in changes.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_copy_of_a_bundled_file_loads_from_a_path(tmp_path: Path) -> None:
    path = write_variant(tmp_path, "models/llama-3-8b.yaml")
    assert load_model_profile_file(path) == load_model_profile("llama-3-8b")
    hw = write_variant(tmp_path, "hardware/h100.yaml")
    assert load_hardware_profile_file(hw) == load_hardware_profile("h100")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_kv_heads": None}, r"missing required field 'num_kv_heads'"),
        ({"hidden_size": 0}, r"'hidden_size' must be > 0"),
        ({"head_dim": "128x"}, r"field 'head_dim' must be a number"),
        ({"num_layers": 32.5}, r"field 'num_layers' must be an integer"),
        ({"hiden_size": 4096}, r"unknown field\(s\) hiden_size"),
        ({"num_experts_per_token": 2}, r"num_experts_per_token must be 0"),
        ({"num_active_params": 10**11}, r"num_active_params .* exceeds"),
        ({"tie_word_embeddings": "yes please"}, r"'tie_word_embeddings' must be true or false"),
        ({"source": "  "}, r"'source' must be a non-empty string"),
    ],
)
def test_malformed_model_file_names_file_and_field(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    path = write_variant(tmp_path, "models/llama-3-8b.yaml", **changes)
    with pytest.raises(ProfileError, match=message) as info:
        load_model_profile_file(path)
    assert str(path) in str(info.value)


def test_malformed_moe_and_hardware_files(tmp_path: Path) -> None:
    moe = write_variant(tmp_path, "models/qwen3.5-35b-a3b.yaml", num_experts_per_token=300)
    with pytest.raises(ProfileError, match=r"num_experts_per_token must be in 1\.\.255"):
        load_model_profile_file(moe)
    hw = write_variant(tmp_path, "hardware/h100.yaml", linear_mfu=1.3)
    with pytest.raises(ProfileError, match=r"linear_mfu must be in \(0, 1\]"):
        load_hardware_profile_file(hw)
    raw = tmp_path / "float.yaml"
    raw.write_text(
        write_variant(tmp_path, "hardware/h100.yaml")
        .read_text()
        .replace("peak_flops_per_s: 989000000000000.0", "peak_flops_per_s: 989e12")
    )
    with pytest.raises(ProfileError, match=r"'peak_flops_per_s'.*signed exponent"):
        load_hardware_profile_file(raw)


def test_non_mapping_and_invalid_yaml(tmp_path: Path) -> None:
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ProfileError, match="expected a mapping"):
        load_model_profile_file(listing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_model_profile_file(broken)
