# Test-size overrides for nanoGPT's own train.py on a CPU (applied after config/train_gpt2.py and the
# sweep's --batch_size/--gradient_accumulation_steps flags, which it leaves alone).
dataset = 'tiny'  # data/tiny/{train,val}.bin, written by data/tiny/prepare.py
out_dir = 'out-tiny'
n_layer = 2
n_head = 2
n_embd = 64
block_size = 64
dropout = 0.0
eval_iters = 2
device = 'cpu'
dtype = 'float32'
compile = False
wandb_log = False
