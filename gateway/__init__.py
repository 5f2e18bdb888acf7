"""An asyncio flash-sale gateway that never sells more than there is."""
