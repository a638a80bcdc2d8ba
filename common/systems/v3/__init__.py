"""DeepSeek-V3's training step from first principles (labs 09-13): the model's sourced facts (`facts`), the kernel
list of one layer (`kernels`) and their rates (`kernel_rates`: DeepGEMM, FlashAttention-3, HBM), the F&B pair's step
(`step`), memory per GPU (`memory`), the whole-run model (`model`), the trace-anchored waterfall (`waterfall`) and
DeepSeek's published H800 profile (`trace`).
"""
