"""The plugin's commands: ``immersion fl run`` (:mod:`.run`, its flags generated from the
registered schemes' options by :mod:`.flags`), ``immersion bench sifl`` (:mod:`.bench`) and
``immersion keys flower`` (:mod:`.keys`).
"""
