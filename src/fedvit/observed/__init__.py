"""What the observer holds, read: the app's code (:mod:`app_code`), the records and the reply's kind
(:mod:`recipe`), the transforms (:mod:`augmentation`), the user's model (:mod:`model_spec`) and, from them, one
update as the attacks take it (:mod:`observation`). Below the attacks, which read these and never the truth."""
