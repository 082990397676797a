"""`vidforge review`: a page to look at what a run produced (a curation run's clips with their scores and
decisions, an infer output's samples with their settings, a training run's curves and validation samples).
`build.run` is the entry point; `page` writes the HTML, `thumbs` the thumbnails."""
