"""The one pass: each heap read once into arrays, its lists followed and its account summed there (in C when built), handing anything unsound to the careful walk."""
