"""Reference answers for chapter 00 (the cost of a forward pass). Shown only when the learner asks."""


def count_params(cfg):
    """Parameters of a Llama-style decoder: embedding, per layer attention (GQA: k and v have
    num_key_value_heads heads) + SwiGLU MLP + two RMSNorms, the final norm, and an untied LM head."""
    d, ff, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    hd = getattr(cfg, "head_dim", None) or d // cfg.num_attention_heads
    attn = d * cfg.num_attention_heads * hd * 2 + d * cfg.num_key_value_heads * hd * 2  # q, o; k, v
    layer = attn + 3 * d * ff + 2 * d
    head = 0 if cfg.tie_word_embeddings else V * d
    return V * d + cfg.num_hidden_layers * layer + d + head


def free_tokens(flops, bw, bytes_per_param):
    """Largest k with 2·N·k / flops <= N·bytes / bw, i.e. k <= flops·bytes / (2·bw)."""
    return int(flops * bytes_per_param // (2 * bw))
