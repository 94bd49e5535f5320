"""Hyperparameters of the default model and their Hugging Face config.json form."""
from dataclasses import dataclass, field

SPECIAL_TOKENS = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                  "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                  "</arg_value>", "<tool_response>", "</tool_response>"]


@dataclass
class ModelConfig:
    vocab_size: int = 8192
    hidden_size: int = 256
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    q_lora_rank: int = 128
    kv_lora_rank: int = 128
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 32
    v_head_dim: int = 64
    intermediate_size: int = 640  # dense SwiGLU of the first layer
    moe_intermediate_size: int = 160
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    n_shared_experts: int = 1
    routed_scaling_factor: float = 1.0
    first_k_dense_replace: int = 1
    index_n_heads: int = 4
    index_head_dim: int = 64
    index_topk: int = 128
    index_topk_freq: int = 4
    index_skip_topk_offset: int = 3
    rope_theta: float = 100000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 32768
    num_nextn_predict_layers: int = 1
    initializer_range: float = 0.02
    indexer_types: list = field(default_factory=list)

    def __post_init__(self):
        if not self.indexer_types:
            # Same rule as GLM-5: full iff max(i - offset + 1, 0) % freq == 0 -> F F F S S S F S for 8 layers.
            self.indexer_types = ["full" if max(i - self.index_skip_topk_offset + 1, 0) % self.index_topk_freq == 0
                                  else "shared" for i in range(self.num_hidden_layers)]

    @property
    def qk_head_dim(self):
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def hf_config(self, special_ids: dict, rope_interleave: bool, indexer_rope_interleave: bool) -> dict:
        """config.json in the Hub layout of zai-org/GLM-5 (model_type glm_moe_dsa)."""
        eos = [special_ids["<|endoftext|>"], special_ids["<|user|>"], special_ids["<|observation|>"]]
        return {
            "architectures": ["GlmMoeDsaForCausalLM"],
            "model_type": "glm_moe_dsa",
            "torch_dtype": "bfloat16",
            "dtype": "bfloat16",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "head_dim": self.qk_rope_head_dim,
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "n_shared_experts": self.n_shared_experts,
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": True,
            "routed_scaling_factor": self.routed_scaling_factor,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "first_k_dense_replace": self.first_k_dense_replace,
            "mlp_layer_types": ["dense" if i < self.first_k_dense_replace else "sparse"
                                for i in range(self.num_hidden_layers)],
            "index_n_heads": self.index_n_heads,
            "index_head_dim": self.index_head_dim,
            "index_topk": self.index_topk,
            "index_topk_freq": self.index_topk_freq,
            "index_skip_topk_offset": self.index_skip_topk_offset,
            "indexer_types": list(self.indexer_types),
            "index_share_for_mtp_iteration": True,
            "rope_interleave": rope_interleave,
            "indexer_rope_interleave": indexer_rope_interleave,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "initializer_range": self.initializer_range,
            "bos_token_id": special_ids["[gMASK]"],
            "eos_token_id": eos,
            "pad_token_id": special_ids["<|endoftext|>"],
            "use_cache": True,
        }
