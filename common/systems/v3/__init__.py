"""DeepSeek-V3's training step from first principles (labs 09-13): the model's sourced facts (`facts`), the kernel
list of one layer (`kernels`) and their rates (`kernel_rates`: DeepGEMM, FlashAttention-3, HBM), the F&B pair's step
(`step`), memory per GPU (`memory`), the whole-run model (`model`), the trace-anchored waterfall (`waterfall`),
DeepSeek's published H800 profile (`trace`), what the prediction rests on and how far each judgement call moves it
(`audit`), and the rates lab 13's layer exercise builds from (`kit`).
"""
