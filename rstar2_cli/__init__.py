"""rstar2: reproduce and extend rStar2-Agent."""
__version__ = "0.1.0"
