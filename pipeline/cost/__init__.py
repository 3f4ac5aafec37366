"""cost: FLOPs and bytes of each op from its shapes and dtypes (`formulas`), split over the kernels
it launched, against the peaks of the matched device (`devices`, `roofline`); kernels named by
category (`categories`). `enrich` writes them into a flattened trace."""
