"""Building blocks several methods share. A method never imports another method: both import from here."""
