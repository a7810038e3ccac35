"""What the frames mean: the Store (state, frame handlers, queries), pure figures, who waits for whom, per-host figures, host clocks and the AllReduce cost model."""
