// The one unit of dsa_torch_pch (optimized/CMakeLists.txt): the target exists to make the
// precompiled LibTorch header that the LibTorch units of the project reuse; this unit is empty.
