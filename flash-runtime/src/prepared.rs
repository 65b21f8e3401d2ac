//! A launch whose arguments passed every check.
//!
//! Only `launch::prepare` builds one (after the operand, param, shape and device checks), so
//! holding one is what [`ffi::launch_prepared`](crate::ffi) needs. It sits below both modules so
//! that neither imports the other's internals.

use cudarc::driver::{CudaFunction, CudaStream};

pub(crate) struct PreparedLaunch<'a> {
    /// The kernel's entry point, loaded into the runtime's context.
    func: &'a CudaFunction,
    /// The runtime's stream, which the views were taken on.
    stream: &'a CudaStream,
    /// The entry-point name, for error messages.
    name: &'a str,
    /// The packed argument struct, 8-byte words.
    args: Vec<u64>,
    grid: (u32, u32, u32),
    threads: u32,
    smem_bytes: u32,
    /// Nothing to compute (an empty grid).
    empty: bool,
}

impl<'a> PreparedLaunch<'a> {
    /// For `launch::prepare` only, after every check of the `# Safety` list of
    /// `ffi::launch_prepared` passed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        func: &'a CudaFunction,
        stream: &'a CudaStream,
        name: &'a str,
        args: Vec<u64>,
        grid: (u32, u32, u32),
        threads: u32,
        smem_bytes: u32,
    ) -> Self {
        let empty = grid.0 == 0 || grid.1 == 0 || grid.2 == 0;
        PreparedLaunch {
            func,
            stream,
            name,
            args,
            grid,
            threads,
            smem_bytes,
            empty,
        }
    }
    pub(crate) fn function(&self) -> &'a CudaFunction {
        self.func
    }
    pub(crate) fn stream(&self) -> &'a CudaStream {
        self.stream
    }
    pub(crate) fn name(&self) -> &'a str {
        self.name
    }
    pub(crate) fn args(&self) -> &[u64] {
        &self.args
    }
    pub(crate) fn grid(&self) -> (u32, u32, u32) {
        self.grid
    }
    pub(crate) fn threads(&self) -> u32 {
        self.threads
    }
    pub(crate) fn smem_bytes(&self) -> u32 {
        self.smem_bytes
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.empty
    }
}
