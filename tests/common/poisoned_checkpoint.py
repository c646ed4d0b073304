"""A copy of a test checkpoint with one weight made non-finite, for the Python tests that hold that a request whose
logits allow no token ends alone (tests/common/poisoned_checkpoint.h does the same for the C tests). tiny-untied is
the one to poison: its lm_head is not its embedding, so a +inf in the embedding row of a token reaches only the
requests that read that token."""
import json, os, shutil, struct, tempfile

POISONED_TOKEN = 9707  # "Hello"
HIDDEN = 32            # hidden_size of tiny and tiny-untied


def make(source, tensor="model.embed_tokens.weight", element=POISONED_TOKEN * HIDDEN + 5, value=float("inf")):
    """Copies every file of `source` (symlinks followed) into a new temporary folder and sets one element of
    `tensor` (BF16 or F32, in whichever .safetensors file holds it) to `value`. Returns the folder."""
    folder = tempfile.mkdtemp(prefix="kite-poisoned-")
    patched = 0
    for name in sorted(os.listdir(source)):
        path = os.path.join(source, name)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = bytearray(f.read())
        if name.endswith(".safetensors"):
            (header_length,) = struct.unpack_from("<Q", data, 0)
            header = json.loads(data[8:8 + header_length])
            if tensor in header:
                entry = header[tensor]
                size = {"BF16": 2, "F32": 4}[entry["dtype"]]
                at = 8 + header_length + entry["data_offsets"][0] + element * size
                assert at + size <= 8 + header_length + entry["data_offsets"][1], (tensor, element)
                bits = struct.pack("<f", value)
                data[at:at + size] = bits[4 - size:]  # BF16 is the float's upper half
                patched += 1
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    assert patched == 1, (source, tensor, patched)
    return folder


def remove(folder):
    shutil.rmtree(folder)
