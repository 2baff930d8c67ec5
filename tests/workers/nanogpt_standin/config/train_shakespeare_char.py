out_dir = "out-shakespeare-char"
eval_interval = 250
dataset = "shakespeare_char"
learning_rate = 0.1
max_iters = 5000
