"""tests/cli/lora_make.py: write a random PEFT LoRA adapter for a Llama
config (the layout llm-finetune writes and Hugging Face PEFT loads), for
tests that need adapters quickly.

usage: lora_make.py CONFIG.json OUT_DIR --rank R --seed S [--alpha A]
                    [--targets q_proj,v_proj,...] [--bad-rank]

A and B are uniform in [-0.5, 0.5) (B nonzero, unlike a fresh adapter, so
the adapter changes the model). --bad-rank writes one B of rank R + 1 while
adapter_config.json says R: a file whose rank does not fit."""
import json, os, random, struct, sys

def main():
    a = sys.argv[1:]
    cfg, out = a[0], a[1]
    opt = dict(zip(a[2::2], a[3::2])) if '--bad-rank' not in a else dict(zip([x for x in a[2:] if x != '--bad-rank'][0::2], [x for x in a[2:] if x != '--bad-rank'][1::2]))
    r, seed = int(opt['--rank']), int(opt['--seed'])
    alpha = float(opt.get('--alpha', 2 * r))
    targets = opt.get('--targets', 'q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj').split(',')
    c = json.load(open(cfg))
    d, ff, nl = c['hidden_size'], c['intermediate_size'], c['num_hidden_layers']
    dh = c.get('head_dim', d // c['num_attention_heads'])
    dq, dkv = c['num_attention_heads'] * dh, c['num_key_value_heads'] * dh
    dims = {'q_proj': (d, dq), 'k_proj': (d, dkv), 'v_proj': (d, dkv), 'o_proj': (dq, d),
            'gate_proj': (d, ff), 'up_proj': (d, ff), 'down_proj': (ff, d)}
    rng = random.Random(seed)
    tensors, first = [], True
    for l in range(nl):
        for t in targets:
            din, dout = dims[t]
            parent = 'self_attn' if t in ('q_proj', 'k_proj', 'v_proj', 'o_proj') else 'mlp'
            base = 'base_model.model.model.layers.%d.%s.%s' % (l, parent, t)
            rb = r + 1 if '--bad-rank' in a and first else r
            first = False
            tensors.append((base + '.lora_A.weight', (r, din)))
            tensors.append((base + '.lora_B.weight', (dout, rb)))
    hdr, blobs, off = {}, [], 0
    for name, shape in tensors:
        n = shape[0] * shape[1]
        b = struct.pack('<%df' % n, *[rng.random() - 0.5 for _ in range(n)])
        hdr[name] = {'dtype': 'F32', 'shape': list(shape), 'data_offsets': [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr).encode()
    h += b' ' * (-len(h) % 8)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, 'adapter_model.safetensors'), 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h + b''.join(blobs))
    json.dump({'peft_type': 'LORA', 'task_type': 'CAUSAL_LM', 'r': r, 'lora_alpha': alpha, 'lora_dropout': 0.0,
               'target_modules': targets, 'bias': 'none', 'fan_in_fan_out': False, 'use_dora': False,
               'use_rslora': False, 'base_model_name_or_path': None},
              open(os.path.join(out, 'adapter_config.json'), 'w'), indent=2)

main()
