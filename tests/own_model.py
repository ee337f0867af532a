"""A user's own model for the tests of ``python -m refimpl.train KIND --target PATH``: a small random Hugging Face
Llama saved to a folder with the ``tiny`` tokenizer."""
import torch


def random_llama(folder, tok, seed: int, hidden: int = 64, heads: int = 4, kv_heads: int = 2) -> str:
    """A 2-layer Llama ``hidden`` wide on tokenizer ``tok`` with peaked random logits (weights drawn at std 0.3:
    its greedy answers are a function a drafter can learn, where a near-uniform one would leave nothing to fit);
    -> the folder."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = AutoConfig.for_model("llama", vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=2,
                               num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=2 * hidden,
                               max_position_embeddings=4096, initializer_range=0.3, bos_token_id=tok.bos_token_id,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)
