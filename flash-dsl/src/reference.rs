//! Float64 CPU reference. (Owned by the plan/reference work.)
