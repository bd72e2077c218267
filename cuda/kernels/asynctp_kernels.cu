// asynctp_kernels.cu: the one translation unit of the kernels image
// (build/asynctp_kernels.fatbin). Each family lives in its own file.
#include "elementwise.cu"
#include "norm.cu"
#include "activation.cu"
#include "attention.cu"
#include "embedding.cu"
#include "loss.cu"
#include "optim.cu"
#include "moe.cu"
#include "grouped.cu"
#include "attention_tc.cu"
#include "gemm_sm90.cu"
