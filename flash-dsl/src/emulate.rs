//! CPU emulation of the planned tiled computation. (Owned by the plan/reference work.)
