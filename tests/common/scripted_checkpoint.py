"""A scripted checkpoint for kite's Python tests (tests/cli): the tiny checkpoint's shapes and tokenizer with
weights that make greedy decoding a fixed successor for each of a few tokens, whatever came before. Each
scripted token's embedding is its own one-hot direction, the attention and MLP outputs are zero (so the
residual stream is the current token's embedding), and lm_head maps that direction to the token's successor.
A chat answer is thus written by the script, which is how reasoning_content, tool_calls and forced tool
choices are tested end to end with a model that cannot write them by chance.

The successors (token -> next token) make these answers:
  - after a chat prompt ("...assistant\\n", ends in "\\n"):
      <think>ok</think>Sure<tool_call>{"name": "get_weather","arguments": {"city":"Paris"}}</tool_call>
    and the end of text;
  - after tool_choice "required"'s opening (ends in ' "'): get_weather","arguments": {"city":"Paris"}}</tool_call>
  - after a named function's opening (ends in '":'): {"city":"Paris"}}</tool_call>
The three share their tails; a token that is scripted has one successor, so none appears twice in a path."""
import json, os, shutil, struct

# (token, successor) pieces as the tokenizer's vocabulary spells them (byte-level: "Ċ" is "\n", "Ġ" a space).
CHAT_ANSWER = ["Ċ", "<think>", "ok", "</think>", "Sure", "<tool_call>", '{"', "name", '"', ":", 'Ġ"', "get",
               "_weather", '","', "arguments", '":', 'Ġ{"', "city", '":"', "Paris", '"}}', "</tool_call>",
               "<|endoftext|>"]
# The named opening ends in '":' and the required one in 'Ġ"': both are on CHAT_ANSWER's path already.
ANSWER_TOKENS = len(CHAT_ANSWER) - 1  # what a chat answer generates, the end of text included
REQUIRED_TOKENS = len(CHAT_ANSWER) - CHAT_ANSWER.index('Ġ"') - 1  # after the required opening
NAMED_TOKENS = len(CHAT_ANSWER) - CHAT_ANSWER.index('":') - 1  # after a named opening


def bf16(value):
    return struct.pack("<f", value)[2:]  # the upper half of a float32: exact for 0, 1 and 10


def write_safetensors(path, tensors):
    """tensors: [(name, shape, bytes)] in bf16."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, data in tensors:
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, data in tensors:
            f.write(data)


def write_scripted_checkpoint(tiny, folder):
    """The scripted checkpoint in `folder` (created), from the tiny checkpoint's folder `tiny`."""
    with open(os.path.join(tiny, "config.json")) as f:
        config = json.load(f)
    config["tie_word_embeddings"] = False
    with open(os.path.join(tiny, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    vocab = dict(tokenizer["model"]["vocab"])
    vocab.update({t["content"]: t["id"] for t in tokenizer["added_tokens"]})
    chain = [vocab[p] for p in CHAT_ANSWER]
    hidden, vocab_size = config["hidden_size"], config["vocab_size"]
    assert len(set(chain)) == len(chain) and len(chain) - 1 <= hidden, chain
    assert chain[-1] == config["eos_token_id"], (chain[-1], config["eos_token_id"])
    embed, head = bytearray(vocab_size * hidden * 2), bytearray(vocab_size * hidden * 2)
    for i, token in enumerate(chain[:-1]):
        embed[(token * hidden + i) * 2:(token * hidden + i) * 2 + 2] = bf16(1.0)
        successor = chain[i + 1]
        head[(successor * hidden + i) * 2:(successor * hidden + i) * 2 + 2] = bf16(10.0)

    def zeros(*shape):
        n = 1
        for s in shape:
            n *= s
        return bytes(2 * n)

    def ones(n):
        return bf16(1.0) * n
    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    inter = config["intermediate_size"]
    tensors = [("model.embed_tokens.weight", [vocab_size, hidden], bytes(embed)),
               ("lm_head.weight", [vocab_size, hidden], bytes(head)), ("model.norm.weight", [hidden], ones(hidden))]
    for layer in range(config["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        tensors += [(p + "input_layernorm.weight", [hidden], ones(hidden)),
                    (p + "post_attention_layernorm.weight", [hidden], ones(hidden)),
                    (p + "self_attn.q_norm.weight", [head_dim], ones(head_dim)),
                    (p + "self_attn.k_norm.weight", [head_dim], ones(head_dim)),
                    (p + "self_attn.q_proj.weight", [heads * head_dim, hidden], zeros(heads * head_dim, hidden)),
                    (p + "self_attn.k_proj.weight", [kv_heads * head_dim, hidden], zeros(kv_heads * head_dim, hidden)),
                    (p + "self_attn.v_proj.weight", [kv_heads * head_dim, hidden], zeros(kv_heads * head_dim, hidden)),
                    (p + "self_attn.o_proj.weight", [hidden, heads * head_dim], zeros(hidden, heads * head_dim)),
                    (p + "mlp.gate_proj.weight", [inter, hidden], zeros(inter, hidden)),
                    (p + "mlp.up_proj.weight", [inter, hidden], zeros(inter, hidden)),
                    (p + "mlp.down_proj.weight", [hidden, inter], zeros(hidden, inter))]
    os.makedirs(folder)
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(tiny, name), folder)
