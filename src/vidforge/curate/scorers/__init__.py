"""The models behind the curation filters, each scoring frames or clips (aesthetic, on-screen text,
watermark, motion, caption-video match); `curate.filters` turns their scores into keep/reject."""
