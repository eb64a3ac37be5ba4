// The kernel sources the emulation tests run, compiled as host C++ after
// warp_emulator.h, in the order nvrtc.rs concatenates them (those these
// tests need; a later file may use an earlier one's definitions).
#pragma once

#include "warp_emulator.h"

#include "../../src/kernels/common.cuh"
#include "../../src/kernels/matmul.cu"
#include "../../src/kernels/elementwise.cu"
#include "../../src/kernels/route.cu"
// moe.cu's one shared array is dynamic (`extern __shared__`, in moe_group,
// which is not run here): there `__shared__` adds nothing.
#undef __shared__
#define __shared__
#include "../../src/kernels/moe.cu"
#undef __shared__
#define __shared__ static
#include "../../src/kernels/q8dot.cu"
#include "../../src/kernels/q8one.cu"
#include "../../src/kernels/mmq.cu"
#include "../../src/kernels/tcmm.cu"
#include "../../src/kernels/tcmoe.cu"
#include "../../src/kernels/q8mma.cu"
#include "../../src/kernels/kq.cu"
