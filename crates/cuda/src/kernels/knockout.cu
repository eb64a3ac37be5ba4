// The stand-in of a launch hollowed by the knockout switch (knockout.rs,
// `TURBOSPARK_CUDA_KNOCKOUT=~name`, a measurement never for use): launched
// with the grid, block and dynamic shared memory of the kernel it stands
// for, it only waits for the kernel before it and lets the next one in
// (KERNEL_ENTRY), so a recorded step keeps that launch's place in the
// chain and loses its work.
KERNEL void hollow_step() {
    KERNEL_ENTRY();
}
